"""``serverless-worker drain``: drain a worker instance from a terminal, as DrainFunction does.

Stops pulling (every scheduler tick sees the draining flag in the state table), tells the
job server, hands back what never started, waits up to the grace period for running jobs,
then shuts the worker down. ``--resume`` clears the flag so the next tick pulls again.
Settings come from the ``SW_*`` environment, as in the functions, with the settings
flags on top (the same ones as ``serverless-worker local``); the code path is the
DrainFunction's own (``runtime.entry.drain_worker``).

Example::

    SW_API_KEY_SECRET_ARN=arn:aws:secretsmanager:... serverless-worker drain \\
        --table-name my-worker-StateTable-1A2B --base-url https://jobs.example.com \\
        --instance-id my-worker --grace-seconds 120
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["register", "run"]

DEFAULT_GRACE_SECONDS = 60.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``drain`` subcommand."""
    from ._flags import add_settings_flags

    parser = subparsers.add_parser(
        "drain",
        help="drain a deployed worker (stop pulling, finish or hand back in-flight jobs, shut down)",
        description="Drain one worker instance: stop pulling, report draining, hand back deliveries "
                    "that never started, wait up to the grace period for running ones, then shut the "
                    "worker down at the job server. Settings come from SW_* environment variables "
                    "(as in the functions) and the flags below. Exits 1 when jobs were still running "
                    "at the end of the grace period.",
    )
    parser.add_argument("--grace-seconds", type=_seconds, default=None, metavar="N",
                        help="how long to wait for running jobs (default: SW_DRAIN_GRACE_SECONDS, else 60)")
    parser.add_argument("--resume", action="store_true",
                        help="clear the draining flag instead, so the next scheduler tick pulls again")
    parser.add_argument("--table-name", metavar="NAME",
                        help="the stack's state table, its StateTableName output [SW_TABLE_NAME]")
    add_settings_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the drain (or resume) and print its report as JSON."""
    from ..errors import ERROR_PREFIX
    from ..runtime.context import LocalContext
    from ..runtime.entry import drain_worker
    from ._flags import env_name, settings_from_args

    # Flags become the variables the function reads, so both are parsed by the same code.
    given = settings_from_args(args)
    if args.table_name is not None:
        given["table_name"] = args.table_name
    for field, value in given.items():
        os.environ[env_name(field)] = str(value)
    # Like uvicorn's --app-dir: the handler module (default functions.handlers) is found from here.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    grace = args.grace_seconds
    if grace is None:
        grace = _seconds(os.environ.get(env_name("drain_grace_seconds")) or str(DEFAULT_GRACE_SECONDS))
    event = {"resume": True} if args.resume else {"grace_seconds": grace}
    context = LocalContext(function_name="serverless-worker-drain", timeout_seconds=max(900.0, grace + 120.0))
    report = drain_worker(event, context)
    print(json.dumps(report, indent=2, default=str), flush=True)
    still_running = int(report.get("still_running", 0) or 0)
    if still_running:
        print(f"{ERROR_PREFIX}{still_running} deliveries were still running when the grace period ended; "
              "nothing is lost: each finishes or is reaped later (handed back to the server)", file=sys.stderr)
        return 1
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds (0 or more)")
    return value
