"""``serverless-worker ledger [JOB_ID ...]``: what the worker recorded of each delivery.

Reads the local runner's SQLite state file (``--state``, ``SW_STATE_PATH``, by default the
one ``local`` keeps in the working directory), or a deployed stack's DynamoDB table
(``--stack-name``: the table from the stack's ``StateTableName`` output; ``--table-name``
names it directly), with the AWS credentials, region and endpoint of the environment. One
line per delivery, newest last: job id, handler, status, outcome, attempt; ``--status`` and
``--handler`` filter; with job ids, each delivery of those jobs in full (the input, the
whole outcome, the receipt, the deadline). ``--json`` prints the entries as JSON. Tokens
are never shown.

Example::

    serverless-worker ledger --status failed
    serverless-worker ledger --stack-name my-worker 1003 --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..local.ledger_view import LedgerEntry

__all__ = ["register", "run"]

_DEFAULT_LIMIT = 50
_LINE_MAX = 120   # the outcome text in a list line; a job id shows it whole


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``ledger`` subcommand."""
    from ..local.defaults import LOCAL_STATE_PATH
    from ..local.ledger_view import STATUS_GROUPS

    parser = subparsers.add_parser(
        "ledger", help="list the deliveries the worker recorded (local state file or a deployed stack); "
                       "JOB_ID: one job's full record",
        description="List what the worker recorded of each delivery: its status, attempts, stored outcome and "
                    "deadline, from the local state file or a deployed stack's table. With JOB_ID, each delivery "
                    "of that job in full.")
    parser.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="show these jobs' deliveries in full")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--state", metavar="PATH", dest="state_path",
                       help=f"the local state file (default SW_STATE_PATH, else {LOCAL_STATE_PATH})")
    where.add_argument("--stack-name", metavar="NAME",
                       help="a deployed stack: its table comes from its StateTableName output")
    where.add_argument("--table-name", metavar="NAME", help="a deployed stack's state table, by name")
    status = parser.add_argument("--status", action="append", metavar="STATUS",
                                 help=f"only these (repeatable): {', '.join(STATUS_GROUPS)}, or a ledger status "
                                      "such as RUNNING or HANDED_BACK (docs/ledger.md)")
    status.completer = lambda prefix, **_: [w for w in STATUS_GROUPS if w.startswith(prefix)]  # type: ignore[attr-defined]
    parser.add_argument("--handler", action="append", dest="handler_names", metavar="NAME",
                        help="only this handler's (repeatable)")
    parser.add_argument("--limit", type=int, default=_DEFAULT_LIMIT, metavar="N",
                        help=f"the N most recent deliveries (default {_DEFAULT_LIMIT}; 0: all)")
    parser.add_argument("--json", action="store_true", help="the entries as JSON (a list)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..errors import ConfigurationError
    from ..local.defaults import LOCAL_STATE_PATH
    from ..local.ledger_view import read_deployed, read_local, select, stack_table_name
    from ._flags import env_name

    if args.stack_name or args.table_name:
        table = args.table_name or stack_table_name(args.stack_name)
        entries, source = read_deployed(table), f"table {table}"
    else:
        path = Path(args.state_path or os.environ.get(env_name("state_path"), "").strip() or LOCAL_STATE_PATH)
        entries, source = read_local(path.expanduser()), f"state file {path}"
    chosen = select(entries, status=args.status, handler=args.handler_names, job_ids=args.job_ids or None)
    if args.job_ids:
        missing = sorted(set(args.job_ids) - {entry.job_id for entry in chosen})
        if missing and not chosen:
            raise ConfigurationError(f"no delivery of job {', '.join(missing)} in the {source} "
                                     "(`serverless-worker ledger` lists them)")
    elif args.limit > 0:
        chosen = chosen[-args.limit:]
    full = bool(args.job_ids)
    if args.json:
        shown = [entry.model_dump(mode="json", exclude=None if full else {"input"}) for entry in chosen]
        print(json.dumps(shown, indent=2))
        return 0
    if not chosen:
        print(f"no deliveries in the {source}" + (" match" if args.status or args.handler_names else ""))
        return 0
    print("\n\n".join(_block(entry) for entry in chosen) if full else "\n".join(_line(entry) for entry in chosen))
    if not full and len(chosen) < len(select(entries, status=args.status, handler=args.handler_names)):
        print(f"(the {len(chosen)} most recent; --limit 0 lists all)")
    return 0


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _outcome(entry: LedgerEntry) -> str:
    from ..textforms import coded_message

    outcome = entry.outcome
    if outcome is None:
        return entry.error or "-"
    if outcome.kind == "success":
        return "success"
    return f"{outcome.kind} {coded_message(outcome.code, outcome.message)}"


def _line(entry: LedgerEntry) -> str:
    from ..textforms import clipped_line

    return (f"{entry.job_id}  {entry.handler}  {entry.status}  {clipped_line(_outcome(entry), _LINE_MAX)}  "
            f"attempt {entry.attempt}  {_when(entry.updated_at)}")


def _compact(value: Any) -> str:
    if isinstance(value, str):  # a payload sent as JSON text (Pipelogiq's input) shown as the JSON it holds
        with contextlib.suppress(ValueError):
            value = json.loads(value)
    return json.dumps(value, separators=(", ", ": "), default=str, ensure_ascii=False)


def _block(entry: LedgerEntry) -> str:
    """One delivery in full, one labelled line each (a message of several lines indented)."""
    from ..textforms import coded_message

    lines = [f"job {entry.job_id}  {entry.handler}  ({entry.protocol}, instance {entry.instance})",
             f"  ledger key  {entry.key}",
             f"  status      {entry.status}: {entry.where}",
             f"  attempt     {entry.attempt} · handler runs {entry.runs} · dispatched by {entry.dispatch_mode}"
             + (" · delivered again while in flight" if entry.redelivered else ""),
             f"  recorded    {_when(entry.recorded_at)} · last written {_when(entry.updated_at)}"]
    if entry.deadline is not None:
        lines.append(f"  deadline    {_when(entry.deadline)} (its lease's end: past it, the reaper settles it)")
    outcome = entry.outcome
    if outcome is not None:
        lines.append(f"  outcome     {outcome.kind}" + ("" if outcome.retryable is None or outcome.kind == "success"
                                                      else f" ({'retryable' if outcome.retryable else 'final'})"))
        if outcome.code or outcome.message:
            first, *more = coded_message(outcome.code, outcome.message).splitlines() or [""]
            lines.append(f"  error       {first}")
            lines += [f"              {line}" for line in more]
        if outcome.value is not None:
            lines.append(f"  {'result' if outcome.kind == 'success' else 'details'}      {_compact(outcome.value)}")
    if entry.report is not None:
        lines.append(f"  report      {_compact(entry.report)}")
    if entry.error:
        lines.append(f"  why         {entry.error}")
    if entry.settle_failures:
        lines.append(f"  settling    failed {entry.settle_failures} time(s) in a row so far")
    lines.append(f"  input       {_compact(entry.input)}")
    return "\n".join(lines)

