"""What the worker recorded of each delivery, read back for a user (``serverless-worker ledger``):
from the local runner's SQLite state file, or from a deployed stack's DynamoDB table, which
is found from the stack's outputs (``StateTableName``).

Each ledger item becomes a :class:`LedgerEntry`: the job and its delivery, the ledger's
status and where that leaves the job, attempts and runs, the deadline (a lease's end while
in flight), the stored outcome (kind, code, whole message, value), the server's receipt and
why it was handed back or discarded. Tokens (delivery, session, callback) are never part of
it; the job's input only in a full record. Reading is a scan, on demand: never on a
worker's path.

Example::

    entries = select(read_local(Path(".serverless-worker/state.sqlite3")), status="failed")
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..errors import ConfigurationError, ServerlessWorkerError
from ..model import LedgerStatus, OutcomeKind

__all__ = ["STATUS_GROUPS", "LedgerEntry", "OutcomeView", "read_deployed", "read_local", "select",
           "stack_table_name"]

# Words ``--status`` takes beside the ledger's own statuses (docs/ledger.md).
STATUS_GROUPS = ("in-flight", "final", "done", "failed")
_TABLE_OUTPUT = "StateTableName"

# Why an item in flight has no definite outcome yet, in a user's words.
_WHERE = {
    LedgerStatus.RECORDED: "taken, not started yet",
    LedgerStatus.DISPATCHED: "taken, not started yet",
    LedgerStatus.DISPATCH_FAILED: "dispatch failed; the reaper hands it back",
    LedgerStatus.RUNNING: "the handler is running",
    LedgerStatus.OUTCOME_STORED: "outcome stored, being reported",
    LedgerStatus.REPORTED: "reported, being acknowledged",
    LedgerStatus.ACKNOWLEDGED: "settled: the server has its result",
    LedgerStatus.HANDED_BACK: "settled: handed back unstarted, no attempt used",
    LedgerStatus.DISCARDED: "settled: discarded, no result sent",
}


class OutcomeView(BaseModel):
    """The outcome the worker stored for a delivery."""

    kind: str
    code: str | None = None
    message: str | None = None
    value: Any = None
    retryable: bool | None = None


class LedgerEntry(BaseModel):
    """One delivery as the ledger holds it, without its tokens (``input`` only in full)."""

    model_config = ConfigDict(frozen=True)

    key: str
    job_id: str
    ledger_id: str
    handler: str
    protocol: str
    instance: str
    status: str
    final: bool
    where: str                       # what the status means for the job, in words
    attempt: int                     # the server's attempt number of this delivery
    runs: int                        # handler runs (continuation slices count each)
    dispatch_mode: str
    recorded_at: float
    updated_at: float
    deadline: float | None = None    # while in flight: when it counts as stranded (the lease's end)
    outcome: OutcomeView | None = None
    report: dict[str, Any] | None = None
    error: str | None = None         # why it was handed back, discarded or not dispatched
    redelivered: bool = False
    settle_failures: int = 0
    input: Any = None                # the job's payload (full records only)


def _entry(attributes: dict[str, Any]) -> LedgerEntry:
    from ..state.items import LedgerItem  # boto3's type (de)serializer: only when reading

    item = LedgerItem.from_attributes(attributes)
    outcome = item.outcome
    delivery = item.delivery
    return LedgerEntry(
        key=item.key, job_id=delivery.job_id, ledger_id=delivery.ledger_id, handler=delivery.handler,
        protocol=delivery.protocol, instance=item.instance, status=item.status.value, final=item.is_final,
        where=_WHERE.get(item.status, item.status.value), attempt=delivery.attempt, runs=item.runs,
        dispatch_mode=item.dispatch_mode.value, recorded_at=item.recorded_at, updated_at=item.updated_at,
        deadline=None if item.is_final else item.deadline,
        outcome=None if outcome is None else OutcomeView(kind=outcome.kind.value, code=outcome.error_code,
                                                         message=outcome.message, value=outcome.value,
                                                         retryable=outcome.retryable),
        report=None if item.report is None else item.report.model_dump(mode="json"),
        error=item.error, redelivered=item.redelivered, settle_failures=item.settle_failures,
        input=delivery.payload)


def _entries(documents: Iterable[dict[str, Any]]) -> list[LedgerEntry]:
    """Every readable item, oldest write first (an item this version cannot read is skipped)."""
    entries = []
    for attributes in documents:
        try:
            entries.append(_entry(attributes))
        except (KeyError, ValueError, TypeError):
            continue
    return sorted(entries, key=lambda entry: entry.updated_at)


def read_local(path: Path) -> list[LedgerEntry]:
    """The deliveries in the local runner's state file, read-only (a running worker may hold it)."""
    from ..state.sqlite_store import read_ledger_documents

    if not path.is_file():
        raise ConfigurationError(f"no state file at {path} (--state, SW_STATE_PATH): `serverless-worker local` "
                                 "keeps one there once it has run against a server (the built-in demo's is "
                                 "temporary); for a deployed stack give --stack-name NAME")
    return _entries(read_ledger_documents(path))


def stack_table_name(stack_name: str, client: Any = None) -> str:
    """The stack's state table, from its ``StateTableName`` output; ConfigurationError (one
    line) when the stack or the output is not there or AWS is not reachable."""
    from botocore.exceptions import BotoCoreError, ClientError

    from ..awsclients import aws_setup_error, shared_session

    try:
        cloudformation = client if client is not None else shared_session().client("cloudformation")
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as err:
        message = err.response.get("Error", {}).get("Message", "")
        if "does not exist" in message:
            raise ConfigurationError(f"no stack {stack_name!r} in this account and region (--stack-name; "
                                     f"AWS_DEFAULT_REGION={os.environ.get('AWS_DEFAULT_REGION', 'unset')})") from None
        raise (aws_setup_error(err) or ConfigurationError(f"cannot read stack {stack_name!r}: {message}")) from None
    except (BotoCoreError, ValueError) as err:
        raise (aws_setup_error(err) or ConfigurationError(f"cannot read stack {stack_name!r}: {err}")) from None
    outputs = {output["OutputKey"]: output["OutputValue"] for stack in stacks for output in stack.get("Outputs", [])}
    if _TABLE_OUTPUT not in outputs:
        raise ConfigurationError(f"stack {stack_name!r} has no {_TABLE_OUTPUT} output: is it a serverless-worker "
                                 "stack? (--table-name NAME names the table itself)")
    return str(outputs[_TABLE_OUTPUT])


def read_deployed(table_name: str, client: Any = None) -> list[LedgerEntry]:
    """The deliveries in a deployed stack's state table (one Scan, every page)."""
    from ..state.store import DynamoStateStore

    try:
        return _entries(DynamoStateStore(table_name, client=client).ledger_documents())
    except ServerlessWorkerError:
        raise
    except Exception as err:  # botocore's setup errors (no region, no credentials), in one line
        from ..awsclients import aws_setup_error

        clear = aws_setup_error(err)
        if clear is None:
            raise
        raise clear from None


def _status_matches(entry: LedgerEntry, wanted: str) -> bool:
    if wanted == "in-flight":
        return not entry.final
    if wanted == "final":
        return entry.final
    kind = entry.outcome.kind if entry.outcome is not None else None
    reported = entry.status in (LedgerStatus.REPORTED.value, LedgerStatus.ACKNOWLEDGED.value)
    if wanted == "done":
        return reported and kind == OutcomeKind.SUCCESS.value
    if wanted == "failed":
        return reported and kind is not None and kind != OutcomeKind.SUCCESS.value
    return entry.status == wanted.upper()


def select(entries: list[LedgerEntry], *, status: list[str] | None = None, handler: list[str] | None = None,
           job_ids: list[str] | None = None) -> list[LedgerEntry]:
    """The entries matching every filter given: any of ``status`` (a ledger status, or one
    of :data:`STATUS_GROUPS`), any of ``handler``, any of ``job_ids``."""
    unknown = [word for word in status or [] if word.lower() not in STATUS_GROUPS
               and word.upper() not in LedgerStatus.__members__]
    if unknown:
        raise ConfigurationError(f"--status {', '.join(unknown)}: not a status; use one of "
                                 f"{', '.join(STATUS_GROUPS)} or a ledger status "
                                 f"({', '.join(s.value for s in LedgerStatus)})")
    return [entry for entry in entries
            if (not status or any(_status_matches(entry, word.lower()) for word in status))
            and (not handler or entry.handler in handler)
            and (not job_ids or entry.job_id in job_ids)]
