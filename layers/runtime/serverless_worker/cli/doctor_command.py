"""``serverless-worker doctor``: check settings, credential and server without taking work.

The server settings of ``serverless-worker local`` and only those (``DOCTOR_SETTINGS``; a
deployed stack's ``SW_*`` environment works too); ``--smoke`` adds an end-to-end Pipelogiq
pipeline. One line per finding, ``OK``, ``WARN`` (act on it) or ``FAIL``, worded as ``local``
words the same problem; ``--json`` prints the findings as one JSON document instead. The
exit status is ``local``'s: 0 when no check failed, 2 when the setup is refused (a bad
setting, the handler module, the credential, the server, its release), 1 when the smoke
pipeline did not complete. The checks themselves are in ``serverless_worker.local.doctor``.

Example::

    MY_KEY=... serverless-worker doctor --url https://jobs.example.com --api-key-env MY_KEY --smoke
"""

from __future__ import annotations

import argparse
import logging
import sys

__all__ = ["DOCTOR_SETTINGS", "register", "run"]

CHECK_RETRY_ATTEMPTS, CHECK_RETRY_SECONDS = 2, 5.0
# The settings a check uses: which server, how to reach it, the credential, the handlers.
DOCTOR_SETTINGS = frozenset({"protocol", "base_url", "api_key_secret_arn", "api_key_parameter", "handlers",
                             "handler_module", "instance_id", "allow_insecure_http", "connect_timeout",
                             "read_timeout"})
EXIT_REFUSED, EXIT_SMOKE_FAILED = 2, 1


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
    parser.add_argument("--json", action="store_true",
                        help="print the findings as JSON ({protocol, url, passed, findings: [{level, name, "
                             "text}]}) instead of lines")
    add_worker_flags(parser)
    add_settings_flags(parser, only=DOCTOR_SETTINGS)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..credentials import resolve_api_key
    from ..errors import ERROR_PREFIX, ConfigurationError
    from ..local.doctor import SMOKE_HANDLER, Doctor, LoggedWarnings
    from ..local.project import find_project_root
    from ..protocols.base import WorkerProtocol
    from ..protocols.factory import create_client
    from ..protocols.transport import RetryPolicy
    from ..settings import Settings
    from ._resolve import build_settings

    # What the runtime warns of while checking becomes a WARN finding, not a log line; the
    # check line says what failed, so the retry library's own warnings would only repeat it.
    logged = LoggedWarnings()
    root = logging.getLogger()
    root.handlers[:] = [logged]
    root.setLevel(logging.WARNING)
    logging.getLogger("stamina").setLevel(logging.ERROR)
    check_retry = RetryPolicy(attempts=CHECK_RETRY_ATTEMPTS, timeout=CHECK_RETRY_SECONDS)
    setup = build_settings(args)
    settings = setup.settings
    if setup.own_sandbox:
        raise ConfigurationError("doctor checks a job server: give --url URL (or SW_BASE_URL) and its credential")
    if args.smoke and settings.protocol != "pipelogiq":
        raise ConfigurationError(f"--smoke works a Pipelogiq pipeline; a {settings.protocol} server has none "
                                 "(leave --smoke out, or --protocol pipelogiq)")

    def client_for(settings: Settings) -> WorkerProtocol:
        # A check answers in seconds: one retry of a 5xx or lost answer, not a report's 30 s of them.
        return create_client(settings, resolve_api_key(settings), retry=check_retry)

    doctor = Doctor(settings, find_project_root(), client_for,
                    smoke=args.smoke, smoke_handler=args.smoke_handler or SMOKE_HANDLER,
                    smoke_timeout=args.smoke_timeout, logged=logged)
    if not args.json:
        print(f"serverless-worker doctor · {settings.protocol} · {settings.base_url}", flush=True)
    for finding in doctor.run():
        if not args.json:
            print(f"  {finding.level:<4}  {finding.name:<10}  {finding.text}", flush=True)
    if args.json:
        print(doctor.report().model_dump_json(indent=2))
    if not doctor.passed:
        failed = next(finding for finding in doctor.findings if not finding.passed)
        print(f"{ERROR_PREFIX}the {failed.name} check failed (above)", file=sys.stderr)
        return EXIT_SMOKE_FAILED if failed.name == "smoke" else EXIT_REFUSED
    return 0
