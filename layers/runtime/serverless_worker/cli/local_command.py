"""``serverless-worker local``: run the worker on this machine, with the Lambda stack's code.

Without ``--url`` (or ``SW_BASE_URL``) it works a built-in sandbox until idle, seeded with
jobs for the handlers it runs: in this repository the demo's, in a project its own
handlers' sample jobs (``events/<handler>.json``). With ``--url`` it is a worker for a real
server, for development or a plain VM, until Ctrl-C (or ``--until-idle``); the handlers are
the user's (``--handler-module`` or the project's template.yaml, ``cli/_resolve.py``), and
the demo's only with ``--demo-handlers``. ``--json`` prints the summary as JSON on stdout. Every
setting is a flag named after its ``SW_*`` variable (``serverless-worker config``), read
and validated by the one settings model before anything starts; a bad one exits 2 with
a message naming it.

Example::

    serverless-worker local --protocol priostack
    MY_KEY=... serverless-worker local --url https://jobs.example.com --api-key-env MY_KEY
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ._flags import add_settings_flags, add_worker_flags, env_name
from ._resolve import build_settings

__all__ = ["register", "run"]
# Loggers that would print request bodies (delivery tokens in ledger items) at DEBUG.
# The logger job.log writes to (serverless_worker/job.py's ``log``).
JOB_LOGGER = "serverless_worker.job"
_WIRE_LOGGERS = ("botocore", "boto3", "urllib3", "s3transfer", "websockets", "uvicorn", "uvicorn.error")

_EPILOG = """\
examples:
  serverless-worker local                                  a built-in Pipelogiq sandbox: the demo here, a
                                                           project's own handlers in its directory
  serverless-worker local --protocol claimqueue --transport socket
  MY_KEY=... serverless-worker local --url https://jobs.example.com --api-key-env MY_KEY \\
      --handler-module my_handlers.py --handlers resize --concurrency 8
  serverless-worker local --protocol claimqueue --url http://127.0.0.1:8083 --api-key-env TOKEN \\
      --queue resize --criteria '{"format": "jpg"}' --until-idle 10
  serverless-worker local --url https://jobs.example.com --api-key-env MY_KEY --state /var/lib/worker/state.sqlite3

Ctrl-C or SIGTERM drains: no new pulls, running jobs finish, unstarted ones go back; a
second Ctrl-C stops at once. Exit status 0 only when every job taken has a definite outcome.
Killed outright, the next run with the same state file (default .serverless-worker/state.sqlite3
in the working directory) settles every delivery the killed one left; no handler whose outcome
was stored runs again.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``local`` subcommand."""
    parser = subparsers.add_parser(
        "local", help="run the worker here: on a built-in sandbox, or as a worker for a real server (--url)",
        description="Run the scheduler, executors and state-machine steps of the Lambda stack in this "
                    "process, with the state in a SQLite file (--state; a restart on the same file settles "
                    "what a killed run left) and, for long-running handlers only, Step Functions embedded "
                    "(moto). Without --url it works a built-in sandbox until idle, seeded with the demo's jobs "
                    "or the project's sample jobs (events/<handler>.json).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo-handlers", action="store_true",
                        help="let the built-in demo's handlers (this repository's examples) run against the "
                             "server --url names; without it they run only against the built-in sandbox")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON document on stdout (counts, failed jobs with code and "
                             "message, results, latencies, exit_status and verdict); everything else goes to stderr")
    parser.add_argument("--stats", action="store_true",
                        help="end the summary with the HTTP calls per job by endpoint and the state file's "
                             "reads and writes per job (for benchmarks and tuning)")
    add_worker_flags(parser)
    add_settings_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    setup = build_settings(args)
    settings, own_sandbox = setup.settings, setup.own_sandbox
    from rich.console import Console

    from ..local.worker import EXIT_FORCED, LocalRunner

    # With --json, stdout holds the summary's JSON alone: the banner, status and logs go to stderr.
    out = sys.stderr if args.json else sys.stdout
    live = out.isatty()
    console = Console(file=out, highlight=False, width=None if live else 120)
    # job.log lines show unless a log level was asked for: then that level rules them too.
    level_given = args.setting_log_level is not None or bool(os.environ.get(env_name("log_level"), "").strip())
    _configure_logging(settings.log_level, console, live, job_lines=not level_given)
    status = LocalRunner(settings, own_sandbox=own_sandbox, console=console, live=live,
                         stats=bool(getattr(args, "stats", False)), demo_handlers=args.demo_handlers,
                         json_summary=args.json).run()
    if status == EXIT_FORCED:
        # A second Ctrl-C means now: do not wait for handler threads still running.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


class JobLineFormatter(logging.Formatter):
    """A line logged for a job (``job.log``, or the runtime with the job's ``log_context``)
    starts with the job's id and handler: ``job 1004 payment-processor: charged 25.00 EUR``."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        job_id = getattr(record, "job_id", None)
        if job_id is not None:
            handler = getattr(record, "handler", None)
            who = f"job {job_id}" + (f" {handler}" if handler else "")
            record.message = f"{who}: {record.message}"
        return super().formatMessage(record)


def _configure_logging(level: str, console: Any, live: bool, *, job_lines: bool = False) -> None:
    """The level's lines on the console (rich on a terminal, plain on stderr otherwise);
    with ``job_lines``, the handlers' ``job.log`` lines at INFO as well (the local level is
    WARNING by default, which would hide them)."""
    handler: logging.Handler
    if live:
        from rich.logging import RichHandler

        handler = RichHandler(console=console, show_path=False, markup=False, rich_tracebacks=False)
        handler.setFormatter(JobLineFormatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JobLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    job_level = min(logging.INFO, logging.getLevelName(level)) if job_lines else logging.NOTSET
    logging.getLogger(JOB_LOGGER).setLevel(job_level)
    for name in _WIRE_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
