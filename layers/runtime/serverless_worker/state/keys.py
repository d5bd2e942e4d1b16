"""Key layout of the state table, and validation the way DynamoDB itself would refuse.

Every item has a string partition key ``pk`` built as ``kind#part#...#last`` and a
constant sort key naming the kind. Only the *last* part may contain ``#`` (job ids and
instance names are free text); the parts before it (the protocol name) may not, so a
key always splits back unambiguously. Parts are checked here, before any request, so a
bad id fails with a message naming it instead of a bare ``ValidationException``.
"""

from __future__ import annotations

from ..model import Delivery
from .errors import InvalidKeyError

__all__ = [
    "DEADLINE",
    "DUE",
    "HASH_KEY_MAX_BYTES",
    "IN_FLIGHT_INDEX",
    "ITEM_MAX_BYTES",
    "PK",
    "SCOPE",
    "SK",
    "TTL",
    "control_key",
    "counters_key",
    "ledger_key",
    "ledger_key_for",
    "lock_key",
    "parse_ledger_key",
    "scope_of",
    "session_key",
    "sort_key_for",
]

# Attribute names the table definition in template.yaml depends on.
PK, SK = "pk", "sk"
SCOPE, DEADLINE = "scope", "deadline"  # the in-flight index's key, present only while in flight
# The item's own deadline where it is later than the index's `deadline` (which never is later
# than the item's: the index key stays put while a run pushes its deadline out; state/store.py).
DUE = "due"
TTL = "ttl"
IN_FLIGHT_INDEX = "in-flight"

HASH_KEY_MAX_BYTES = 2048          # DynamoDB's partition key limit (also binds the index's `scope`)
ITEM_MAX_BYTES = 400 * 1024        # DynamoDB's item limit, names and values together

_SEP = "#"
_DELIVERY, _SESSION, _LOCK, _COUNTERS, _CONTROL = "delivery", "session", "lock", "counters", "control"
_SORT_KEYS = {_DELIVERY: "delivery", _SESSION: "session", _LOCK: "lock", _COUNTERS: "counters",
              _CONTROL: "control"}


def _short(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


def _part(what: str, value: str, *, last: bool) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidKeyError(f"{what} must be a non-empty string, got {value!r}")
    if not last and _SEP in value:
        raise InvalidKeyError(f"{what} {_short(value)} must not contain {_SEP!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidKeyError(f"{what} {_short(value)} is not valid Unicode (lone surrogate)") from err
    return value


def _hash_key(what: str, *parts: str) -> str:
    key = _SEP.join(parts)
    size = len(key.encode("utf-8"))
    if size > HASH_KEY_MAX_BYTES:
        raise InvalidKeyError(
            f"{what} {_short(parts[-1])} makes a {size}-byte key; DynamoDB partition keys are limited "
            f"to {HASH_KEY_MAX_BYTES} bytes (UTF-8, {len(key) - len(parts[-1])} used by the prefix)")
    return key


def ledger_key(protocol: str, ledger_id: str) -> str:
    """``delivery#{protocol}#{ledger_id}``: the key that travels in events instead of the delivery."""
    return _hash_key("ledger id", _DELIVERY, _part("protocol", protocol, last=False),
                     _part("ledger id", ledger_id, last=True))


def ledger_key_for(delivery: Delivery) -> str:
    return ledger_key(delivery.protocol, delivery.ledger_id)


def parse_ledger_key(key: str) -> tuple[str, str]:
    """Split a ledger key back into ``(protocol, ledger_id)``, validating it on the way."""
    parts = key.split(_SEP, 2) if isinstance(key, str) else []
    if len(parts) != 3 or parts[0] != _DELIVERY:
        raise InvalidKeyError(f"{_short(str(key))} is not a ledger key (delivery#<protocol>#<ledger id>)")
    ledger_key(parts[1], parts[2])
    return parts[1], parts[2]


def session_key(protocol: str, instance: str) -> str:
    return _hash_key("instance", _SESSION, _part("protocol", protocol, last=False),
                     _part("instance", instance, last=True))


def lock_key(name: str) -> str:
    return _hash_key("lock name", _LOCK, _part("lock name", name, last=True))


def counters_key(protocol: str, instance: str) -> str:
    return _hash_key("instance", _COUNTERS, _part("protocol", protocol, last=False),
                     _part("instance", instance, last=True))


def control_key(protocol: str, instance: str) -> str:
    return _hash_key("instance", _CONTROL, _part("protocol", protocol, last=False),
                     _part("instance", instance, last=True))


def scope_of(protocol: str, instance: str) -> str:
    """``{protocol}#{instance}``: the in-flight index's partition, one per worker instance."""
    return _hash_key("instance", _part("protocol", protocol, last=False),
                     _part("instance", instance, last=True))


def sort_key_for(pk: str) -> str:
    """The constant sort key of an item kind (``delivery#...`` -> ``delivery``)."""
    return _SORT_KEYS[pk.split(_SEP, 1)[0]]
