"""The typed view of a ledger item, and conversion to DynamoDB's wire form (statuses: ``model``).

Top-level attributes are native DynamoDB types (they are read by conditions and the
index). Documents (the delivery, outcome, checkpoint, report, session) are stored as
JSON strings: DynamoDB numbers are not JSON numbers (no floats without ``Decimal``,
38 digits at most), and a payload must come back exactly as the server sent it.

Write units are counted per started kilobyte of item, so the ledger item is kept under
1 KB where the job allows: the delivery (the largest document, mostly the server's own
envelope) is stored as raw-deflate compressed JSON bytes (``pack_document``), and model
documents leave out top-level fields that are ``None`` (``compact_model``). Readers accept
both forms (``delivery_record``), so items written before stay readable.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from pydantic import BaseModel

from ..model import Delivery, DispatchMode, LedgerStatus, Outcome, ReportReceipt
from .errors import InvalidKeyError, UnrecordableDeliveryError, UnrecordableKeyError
from .keys import DEADLINE, PK, SCOPE, SK, ledger_key_for, scope_of, sort_key_for

__all__ = [
    "attributes_size",
    "LedgerItem",
    "compact_model",
    "delivery_record",
    "encoded_document",
    "recordable",
    "dumps",
    "from_item",
    "item_size",
    "pack_document",
    "recorded_attributes",
    "to_attribute",
    "to_item",
]


def recorded_attributes(key: str, delivery: Delivery, *, packed_delivery: Any, instance: str, deadline: float,
                        dispatch_mode: DispatchMode | str, now: float,
                        status: LedgerStatus = LedgerStatus.RECORDED, epoch: str | None = None, runs: int = 0,
                        started_at: float | None = None) -> dict[str, Any]:
    """A delivery's new ledger item, as each backend records it. ``packed_delivery`` is the
    delivery as the backend keeps documents (deflated in DynamoDB, JSON text in SQLite).
    Recorded by the scheduler it is ``RECORDED``; by an executor that pulled it itself it is
    already ``RUNNING`` under that run's ``epoch`` (``runs=1``, ``started_at``). ``None``
    values are for the caller to leave out."""
    return {
        PK: key, SK: sort_key_for(key), "status": LedgerStatus(status).value, "delivery": packed_delivery,
        "protocol": delivery.protocol, "handler": delivery.handler, "instance": instance,
        "attempt": delivery.attempt, "dispatch_mode": DispatchMode(dispatch_mode).value, "epoch": epoch,
        "runs": runs, "recorded_at": now, "updated_at": now, "started_at": started_at,
        SCOPE: scope_of(delivery.protocol, instance), DEADLINE: deadline,
    }


def recordable(delivery: Delivery) -> tuple[str, dict[str, Any]]:
    """The delivery's ledger key and its record (``Delivery.to_record``), each made once here
    for the write that follows; :class:`UnrecordableDeliveryError` when either cannot be made.

    Checked per delivery before any write, so one poisoned delivery (a payload nested past
    pydantic's serialisation depth of 254, an id that is not valid Unicode or too long for a
    key) is settled on its own and never fails the batch it came in."""
    try:
        key = ledger_key_for(delivery)
    except InvalidKeyError as err:
        raise UnrecordableKeyError(delivery.job_id, err) from None
    try:
        record = delivery.to_record()
    except RecursionError:
        raise UnrecordableDeliveryError(delivery.job_id, "its content nests too deep to serialise") from None
    except ValueError as err:
        # pydantic's "Maximum serialization depth exceeded"; its other errors name only types.
        why = "nests too deep to serialise" if "depth" in str(err) else f"cannot be serialised ({type(err).__name__})"
        raise UnrecordableDeliveryError(delivery.job_id, f"its content {why}") from None
    return key, record


def encoded_document(job_id: str, text: str) -> bytes:
    """``text`` as UTF-8, the form every backend stores; a lone surrogate (valid in a Python
    string decoded from JSON's ``\\ud800``, in no stored form) makes the delivery unrecordable."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnrecordableDeliveryError(job_id, "its content is not valid Unicode (a lone surrogate)") from None


_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def dumps(document: Any) -> str:
    """Compact JSON, non-ASCII kept as is (UTF-8 is what DynamoDB counts)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def compact_model(model: BaseModel) -> str:
    """A model's JSON without its top-level ``None`` fields (their defaults): bytes an item need not carry."""
    return dumps({name: value for name, value in model.model_dump(mode="json").items() if value is not None})


def pack_document(document: Any, *, job_id: str = "") -> bytes:
    """Compact JSON, raw-deflate compressed (no zlib header: two bytes an item need not carry)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return packer.compress(encoded_document(job_id, dumps(document))) + packer.flush()


def delivery_record(attrs: dict[str, Any]) -> Any:
    """The stored delivery's record, from packed bytes (``pack_document``) or a JSON string."""
    stored = attrs["delivery"]
    if isinstance(stored, bytes):
        return json.loads(zlib.decompress(stored, -15).decode("utf-8"))
    return json.loads(stored)


def to_attribute(value: Any) -> dict[str, Any]:
    """One Python scalar as an AttributeValue (floats go through ``Decimal(repr(x))``)."""
    if isinstance(value, float):
        value = Decimal(repr(value))
    attribute: dict[str, Any] = _serializer.serialize(value)
    return attribute


def to_item(attributes: dict[str, Any]) -> dict[str, Any]:
    return {name: to_attribute(value) for name, value in attributes.items() if value is not None}


def _plain(value: Any) -> Any:
    if isinstance(value, Binary):
        return bytes(value.value)
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def from_item(item: dict[str, Any]) -> dict[str, Any]:
    return {name: _plain(_deserializer.deserialize(value)) for name, value in item.items()}


def _number_size(text: str) -> int:
    digits = text.lstrip("-").split("e")[0].split("E")[0].replace(".", "").strip("0")
    return (max(1, len(digits)) + 1) // 2 + 1


def _value_size(value: dict[str, Any]) -> int:
    (kind, data), = value.items()
    if kind == "S":
        return len(data.encode("utf-8"))
    if kind == "N":
        return _number_size(data)
    if kind == "B":
        return len(data)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(s.encode("utf-8")) for s in data)
    if kind == "NS":
        return sum(_number_size(n) for n in data)
    if kind == "BS":
        return sum(len(b) for b in data)
    if kind == "L":
        return 3 + sum(1 + _value_size(v) for v in data)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + _value_size(v) for k, v in data.items())
    raise ValueError(f"unknown AttributeValue type {kind!r}")


def _plain_size(value: Any) -> int:
    """``_value_size(to_attribute(value))`` computed on the Python value itself."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, int | Decimal):
        return _number_size(str(value))
    if isinstance(value, float):
        return _number_size(repr(value))
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, dict):
        return 3 + sum(1 + len(k.encode("utf-8")) + _plain_size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return 3 + sum(1 + _plain_size(v) for v in value)
    return _value_size(to_attribute(value))  # sets and the rarer types: the serializer's way


def attributes_size(attributes: dict[str, Any]) -> int:
    """``item_size(to_item(attributes))`` without building the wire form: the SQLite backend
    holds DynamoDB's item limit on every write, and the serializer cost it 0.4 ms a job."""
    return sum(len(name.encode("utf-8")) + _plain_size(value) for name, value in attributes.items()
               if value is not None)


# DynamoDB stores a number in at most 21 bytes (38 significant digits, two a byte, plus one).
_MAX_NUMBER_BYTES = 21


def attributes_size_bound(attributes: dict[str, Any]) -> int:
    """An upper bound of :func:`attributes_size` without encoding a string (at most 4 bytes
    a character): the exact count matters only near the limit, and costs more than a write's
    other work for the few short attributes a transition sets."""
    total = 0
    for name, value in attributes.items():
        if value is None:
            continue
        total += 4 * len(name)
        if isinstance(value, str):
            total += 4 * len(value)
        elif isinstance(value, bool):
            total += 1
        elif isinstance(value, int | float | Decimal):
            total += _MAX_NUMBER_BYTES
        else:
            total += _plain_size(value)
    return total


def item_size(item: dict[str, Any]) -> int:
    """DynamoDB's size of an item in wire form: attribute names plus values, in bytes."""
    return sum(len(name.encode("utf-8")) + _value_size(value) for name, value in item.items())


def _loads(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


@dataclass(frozen=True)
class LedgerItem:
    """One delivery's ledger entry, typed. ``key`` is the ledger key (``delivery#...``)."""

    key: str
    status: LedgerStatus
    delivery: Delivery
    instance: str
    dispatch_mode: DispatchMode
    attempt: int
    recorded_at: float
    updated_at: float
    epoch: str | None = None
    deadline: float | None = None        # set only while in flight: when it counts as stranded
    runs: int = 0                        # how many times start_run claimed it (slices, retries)
    renewals: int = 0                    # renew_deadline calls by the current epoch
    settle_failures: int = 0             # settling calls (report, ack, hand back) that failed in a row
    outcome: Outcome | None = None
    checkpoint: Any = None               # a continuation's checkpoint (JSON), cleared with the outcome
    report: ReportReceipt | None = None
    error: str | None = None             # why it was handed back, discarded or not dispatched
    cancel_reason: str | None = None     # set by request_cancel: the run must stop
    handover_requested: bool = False     # set by request_handover: continue as a new execution
    redelivered: bool = False            # the server delivered it again while it was in flight
    callback_token: str | None = field(default=None, repr=False)  # Step Functions task token
    ttl: int | None = None

    @property
    def protocol(self) -> str:
        return self.delivery.protocol

    @property
    def handler(self) -> str:
        return self.delivery.handler

    @property
    def is_final(self) -> bool:
        return self.status.is_final

    @classmethod
    def from_attributes(cls, attrs: dict[str, Any]) -> LedgerItem:
        """Build from a deserialized item (``from_item``)."""
        outcome = _loads(attrs.get("outcome"))
        report = _loads(attrs.get("report"))
        return cls(
            key=attrs["pk"],
            status=LedgerStatus(attrs["status"]),
            delivery=Delivery.from_record(delivery_record(attrs)),
            instance=attrs["instance"],
            dispatch_mode=DispatchMode(attrs["dispatch_mode"]),
            attempt=int(attrs["attempt"]),
            recorded_at=float(attrs["recorded_at"]),
            updated_at=float(attrs["updated_at"]),
            epoch=attrs.get("epoch"),
            deadline=_deadline(attrs),
            runs=int(attrs.get("runs", 0)),
            renewals=int(attrs.get("renewals", 0)),
            settle_failures=int(attrs.get("settle_failures", 0)),
            outcome=Outcome.model_validate(outcome) if outcome is not None else None,
            checkpoint=_loads(attrs.get("checkpoint")),
            report=ReportReceipt.model_validate(report) if report is not None else None,
            error=attrs.get("error"),
            cancel_reason=attrs.get("cancel_reason"),
            handover_requested=bool(attrs.get("handover_requested", False)),
            redelivered=bool(attrs.get("redelivered", False)),
            callback_token=attrs.get("callback_token"),
            ttl=int(attrs["ttl"]) if "ttl" in attrs else None,
        )


def _deadline(attrs: dict[str, Any]) -> float | None:
    """The item's own deadline: ``due`` where the in-flight index's ``deadline`` lags behind it
    (the DynamoDB backend keeps the index key still on the hot path, state/store.py)."""
    value = attrs.get("due", attrs.get("deadline"))
    return float(value) if value is not None else None
