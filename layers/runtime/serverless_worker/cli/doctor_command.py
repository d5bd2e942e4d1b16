"""``serverless-worker doctor``: check settings, credential and server without taking work.

The same settings and flags as ``serverless-worker local`` (a deployed stack's ``SW_*``
environment works too); ``--smoke`` adds an end-to-end Pipelogiq pipeline. One line per
check; exit 0 when every check passed, 1 when one failed, 2 for a usage or settings error.
The checks themselves are in ``serverless_worker.local.doctor``.

Example::

    MY_KEY=... serverless-worker doctor --url https://jobs.example.com --api-key-env MY_KEY --smoke
"""

from __future__ import annotations

import argparse
import logging
import sys

__all__ = ["register", "run"]

CHECK_RETRY_ATTEMPTS, CHECK_RETRY_SECONDS = 2, 5.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``doctor`` subcommand."""
    from ._flags import add_settings_flags, add_worker_flags

    parser = subparsers.add_parser(
        "doctor", help="check settings, credential and the job server without taking work (--smoke: end to end)",
        description="Check that a worker is set up to work, without taking any job: the settings, the "
                    "handler module, the credential, and the job server (reachable, credential accepted). "
                    "--smoke (Pipelogiq) then runs a two-stage pipeline end to end and prints PASS or "
                    "what failed.")
    parser.add_argument("--smoke", action="store_true",
                        help="Pipelogiq: create a two-stage pipeline through /pipelines/idempotent and work it "
                             "(the first stage fails once, then succeeds); creates a worker record and a test "
                             "pipeline on the server")
    parser.add_argument("--smoke-handler", metavar="NAME", default=None,
                        help="stage handler name of the smoke pipeline (default serverless-worker-smoke)")
    parser.add_argument("--smoke-timeout", metavar="SECONDS", type=float, default=60.0,
                        help="how long the smoke pipeline may take (default 60)")
    add_worker_flags(parser)
    add_settings_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..credentials import resolve_api_key
    from ..errors import ConfigurationError
    from ..local.doctor import SMOKE_HANDLER, Doctor
    from ..local.project import find_project_root
    from ..protocols._http import RetryPolicy
    from ..protocols.base import WorkerProtocol
    from ..protocols.factory import create_client
    from ..settings import Settings
    from .local_command import build_settings

    # The check line says what failed; the retry library's own warning would only repeat it.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("stamina").setLevel(logging.ERROR)
    check_retry = RetryPolicy(attempts=CHECK_RETRY_ATTEMPTS, timeout=CHECK_RETRY_SECONDS)
    settings, own_sandbox = build_settings(args)
    if own_sandbox:
        raise ConfigurationError("doctor checks a job server: give --url URL (or SW_BASE_URL) and its credential")

    def client_for(settings: Settings) -> WorkerProtocol:
        # A check answers in seconds: one retry of a 5xx or lost answer, not a report's 30 s of them.
        return create_client(settings, resolve_api_key(settings), retry=check_retry)

    doctor = Doctor(settings, find_project_root(), client_for,
                    smoke=args.smoke, smoke_handler=args.smoke_handler or SMOKE_HANDLER,
                    smoke_timeout=args.smoke_timeout)
    print(f"serverless-worker doctor · {settings.protocol} · {settings.base_url}", flush=True)
    for check in doctor.run():
        print(f"  {check.verdict:<4}  {check.name:<10}  {check.detail}", flush=True)
    if not doctor.passed:
        print("serverless-worker doctor: a check failed (above)", file=sys.stderr)
        return 1
    return 0
