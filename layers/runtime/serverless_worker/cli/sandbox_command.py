"""``serverless-worker sandbox PROTOCOL``: serve one job-server emulator in the foreground;
``serverless-worker sandbox jobs``: read a running sandbox's jobs and their results.

For trying handlers by hand against a server that behaves like the real one, and for
the CLI tests. It prints one line (URL, admin URL, the sandbox's own credentials), then
serves until SIGINT or SIGTERM and exits 0. ``jobs`` asks its admin API (``GET
/_admin/jobs``) and prints one line per job: id, handler, state on the server, result.

Example::

    serverless-worker sandbox pipelogiq --port 8081 --demo --set lease_seconds=5
    serverless-worker sandbox jobs --url http://127.0.0.1:8081
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, SecretStr, ValidationError

from ..errors import ERROR_PREFIX, ConfigurationError
from ..loopback import is_loopback_host
from ..sandbox import SANDBOXES, create_sandbox
from ..textforms import clipped_line, coded_message

if TYPE_CHECKING:
    from ..sandbox import Sandbox, SandboxServer
    from ..sandbox.admin import JobView

__all__ = ["DEFAULT_PORTS", "DEMO_SEEDS", "register", "run"]

# Distinct defaults so the three sandboxes can run side by side; 8081 is the port the
# Pipelogiq guide uses for a local server.
DEFAULT_PORTS = {"pipelogiq": 8081, "priostack": 8082, "claimqueue": 8083}

# A few jobs per protocol, in the admin API's seed format (``POST /_admin/jobs``).
DEMO_SEEDS: dict[str, list[dict[str, Any]]] = {
    "pipelogiq": [
        {"handler": "echo", "inputs": [{"message": "hello"}, {"message": "from the sandbox"}]},
    ],
    "priostack": [
        {"jobs": [
            {"type": "echo", "variables": {"message": "hello"}, "retries": 3},
            {"type": "echo", "variables": {"message": "from the sandbox"}, "retries": 3},
        ]},
    ],
    "claimqueue": [
        {"queue": "resize", "items": [{"image": "cat.png", "width": 64}, {"image": "dog.png", "width": 128}]},
    ],
}

# Config fields holding a credential the sandbox accepts: printed so a user can call it.
_CREDENTIAL_NAME = re.compile(r"api_?key|token|secret|password", re.IGNORECASE)
# Packages of the ``local`` extra the sandboxes import.
_LOCAL_EXTRA = frozenset({"uvicorn", "starlette", "websockets"})


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``sandbox`` subcommand."""
    parser = subparsers.add_parser(
        "sandbox",
        help="serve a local emulator of a job server (pipelogiq, priostack, claimqueue); jobs: read its results",
        description="Serve an in-memory emulator of a job server with an admin API under /_admin "
                    "(seed jobs, read histories, inject faults, change timeouts); `sandbox jobs` reads "
                    "a running one's jobs and results.",
    )
    which = parser.add_subparsers(dest="protocol", required=True, metavar="{" + ",".join([*SANDBOXES, "jobs"]) + "}")
    for protocol in SANDBOXES:
        _add_serve_flags(which.add_parser(protocol, help=f"serve a {protocol} sandbox",
                                          description=f"Serve an in-memory {protocol} job server with an admin "
                                                      "API under /_admin."))
    jobs = which.add_parser(
        "jobs", help="list a running sandbox's jobs: id, handler, state, result",
        description="Read a running sandbox's jobs through its admin API (GET /_admin/jobs): one line per "
                    "job with its id (the handler's job.job_id), handler, state on the server and the "
                    "result the worker reported; with JOB_ID, that job's result in full.")
    jobs.add_argument("job_ids", nargs="*", metavar="JOB_ID", help="show only these jobs, results in full")
    jobs.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORTS['pipelogiq']}",
                      help="the sandbox's URL, as its start line printed it (default http://127.0.0.1:8081)")
    jobs.add_argument("--json", action="store_true", help="the admin API's records as JSON, unabridged")
    jobs.set_defaults(handler=run_jobs)


def _add_serve_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=_port, default=None,
                        help="TCP port (default: pipelogiq 8081, priostack 8082, claimqueue 8083; "
                             "0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-loopback --host (the sandbox has no real security)")
    parser.add_argument("--set", dest="settings", action="append", default=[], type=_setting,
                        metavar="KEY=VALUE",
                        help="sandbox config override; VALUE is parsed as JSON when it can be "
                             "(repeatable)")
    parser.add_argument("--seed", type=Path, metavar="FILE.json",
                        help="seed jobs from a file: one admin seed body, or a JSON list of them")
    parser.add_argument("--demo", action="store_true", help="seed a few demo jobs")
    parser.add_argument("--fault", dest="faults", action="append", default=[], type=_fault,
                        metavar="KIND[@ENDPOINT]",
                        help="a fault that always fires, e.g. ignore_wait@pull (repeatable; the admin "
                             "API's /_admin/faults takes probabilities and counts)")
    parser.set_defaults(handler=run)


_RESULT_MAX = 160  # a result in the list; JOB_ID shows it whole


def run_jobs(args: argparse.Namespace) -> int:
    """Print the sandbox's jobs (or those named), one line each; exit 2 when it cannot be read."""
    import requests

    from ..sandbox.admin import SandboxAdmin, job_view

    admin = SandboxAdmin(args.url, timeout=5.0)
    try:
        records = admin.jobs()
    except (requests.RequestException, ValueError, KeyError, TypeError) as err:
        raise ConfigurationError(f"cannot read the jobs of a sandbox at {args.url} (--url): "
                                 f"{_unreadable(err)}") from None
    finally:
        admin.close()
    views = [(job_view(record), record) for record in records]
    if args.job_ids:
        wanted = set(args.job_ids)
        views = [(view, record) for view, record in views if view.job_id in wanted]
        missing = wanted - {view.job_id for view, _ in views}
        if missing:
            raise ConfigurationError(f"no job {', '.join(sorted(missing))} on the sandbox at {args.url}; "
                                     "`serverless-worker sandbox jobs` lists them")
    if args.json:
        print(json.dumps([record for _, record in views], indent=2, default=str))
        return 0
    if not views:
        print(f"no jobs on the sandbox at {args.url}")
        return 0
    for view, _ in views:
        print(_job_block(view) if args.job_ids else _job_line(view))
    return 0


def _compact(value: Any) -> str:
    return "-" if value is None else json.dumps(value, separators=(", ", ": "), default=str)


def _job_line(view: JobView) -> str:
    """``id  handler  state  result R  error CODE: message  (N attempts)``, each part clipped."""
    failed = view.code or view.message
    error = f"  error {clipped_line(coded_message(view.code, view.message), _RESULT_MAX)}" if failed else ""
    attempts = "" if view.attempts is None else f"  ({view.attempts} attempt{'s' if view.attempts != 1 else ''})"
    result = clipped_line(_compact(view.result), _RESULT_MAX)
    return f"{view.job_id}  {view.handler}  {view.state}  result {result}{error}{attempts}"


def _job_block(view: JobView) -> str:
    """One job in full: its line's head, then the attempts, the error's code and whole
    message, a business error's details and the result, one labelled line each."""
    lines = [f"{view.job_id}  {view.handler}  {view.state}"]
    if view.attempts is not None:
        lines.append(f"  attempts  {view.attempts}")
    if view.code or view.message:
        first, *more = coded_message(view.code, view.message, "no message").splitlines() or [""]
        lines.append(f"  error     {first}")
        lines += [f"            {line}" for line in more]
    if view.details:
        lines.append(f"  details   {_compact(view.details)}")
    lines.append(f"  result    {_compact(view.result)}")
    return "\n".join(lines)


def _unreadable(err: Exception) -> str:
    import requests

    if isinstance(err, requests.ConnectionError):
        return "nothing answers there (is `serverless-worker sandbox PROTOCOL` running?)"
    if isinstance(err, requests.HTTPError) and err.response is not None:
        return f"its admin API answered HTTP {err.response.status_code} (is it a sandbox?)"
    if isinstance(err, requests.Timeout):
        return "no answer within 5 s"
    return "the answer is not a sandbox's job list"


def run(args: argparse.Namespace) -> int:
    """Build, seed and serve the sandbox; returns 0 after SIGINT/SIGTERM."""
    protocol: str = args.protocol
    if not args.allow_remote and not is_loopback_host(args.host):
        raise ConfigurationError(
            f"--host {args.host} is not a loopback address; the sandbox accepts fixed test "
            "credentials, so pass --allow-remote to expose it anyway")
    bodies = _seed_bodies(args.seed, protocol if args.demo else None)
    sandbox = _build(protocol, dict(args.settings))
    if args.faults:
        from ..sandbox import FaultPlan, FaultRule

        sandbox.faults.set(FaultPlan(rules=[FaultRule(kind=kind, endpoint=endpoint)
                                            for kind, endpoint in args.faults]))
    for body in bodies:
        _seed(sandbox, body)
    seeded = len(sandbox.jobs()) if bodies else 0
    port = DEFAULT_PORTS[protocol] if args.port is None else args.port
    server = _bind(sandbox, args.host, port)
    print(_banner(protocol, server.url, sandbox.config, seeded), flush=True)
    return _serve(server)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (0-65535)")
    return port


def _setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw  # a bare string such as --set api_key=abc
    return key.strip(), value



def _fault(text: str) -> tuple[str, str]:
    """``KIND[@ENDPOINT]``, checked against the fault kinds the sandboxes know."""
    from typing import get_args

    from ..sandbox import FaultKind

    kind, _, endpoint = text.partition("@")
    kinds = get_args(FaultKind)
    if kind not in kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kind {kind!r}; known: {', '.join(kinds)}")
    return kind, endpoint or "*"


def _seed_bodies(path: Path | None, demo_protocol: str | None) -> list[Any]:
    """Read the seed file first, so a bad file fails before anything starts."""
    bodies: list[Any] = []
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise ConfigurationError(f"cannot read --seed {path}: {err.strerror or err}") from err
        except json.JSONDecodeError as err:
            raise ConfigurationError(f"--seed {path} is not valid JSON: {err}") from err
        bodies.extend(data if isinstance(data, list) else [data])
    if demo_protocol is not None:
        bodies.extend(DEMO_SEEDS[demo_protocol])
    return bodies


def _build(protocol: str, config: dict[str, Any]) -> Sandbox:
    try:
        sandbox: Sandbox = create_sandbox(protocol, **config)
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] in _LOCAL_EXTRA:
            raise ConfigurationError(
                "the sandboxes need the 'local' extra: pip install 'serverless-worker[local]'") from err
        raise
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigurationError(f"bad --set for the {protocol} sandbox: {problems}") from err
    # Pydantic ignores unknown fields by default; a misspelt --set must not pass silently.
    known = type(sandbox.config).model_fields
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ConfigurationError(
            f"unknown --set {', '.join(unknown)} for the {protocol} sandbox; "
            f"known: {', '.join(sorted(known))}")
    return sandbox


def _seed(sandbox: Sandbox, body: Any) -> None:
    """Seed before serving: no event loop runs yet, so touching state here is safe."""
    try:
        sandbox.seed(body)
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigurationError(f"bad seed body for the {sandbox.name} sandbox: {_one_line(err)}") from err


def _bind(sandbox: Sandbox, host: str, port: int) -> SandboxServer:
    from ..sandbox import SandboxServer  # uvicorn: only when actually serving

    try:
        return SandboxServer(sandbox, host=host, port=port)
    except OSError as err:
        raise ConfigurationError(f"cannot listen on {host}:{port}: {err.strerror or err}") from err


def _credentials(config: BaseModel) -> dict[str, str]:
    """The config's credential fields, revealed: they are the sandbox's own test values."""
    found: dict[str, str] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        # One credential, a list of them, or a mapping keyed by them (key -> application).
        values = list(value) if isinstance(value, list | tuple | dict) else [value]
        texts = [v.get_secret_value() if isinstance(v, SecretStr) else v for v in values]
        is_secret = any(isinstance(v, SecretStr) for v in values)
        if texts and all(isinstance(t, str) for t in texts) and (is_secret or _CREDENTIAL_NAME.search(name)):
            found[name] = ",".join(texts)
    return found


def _banner(protocol: str, url: str, config: BaseModel, seeded: int) -> str:
    creds = " ".join(f"{name}={value}" for name, value in _credentials(config).items())
    parts = [f"{protocol} sandbox serving url={url} admin={url}/_admin", creds,
             f"seeded={seeded}" if seeded else "", "(sandbox-only credentials; Ctrl-C to stop)"]
    return " ".join(part for part in parts if part)


def _serve(server: SandboxServer) -> int:
    """Serve until SIGINT/SIGTERM.

    uvicorn handles both signals while it runs, then restores the previous handlers and
    raises the signal again; handlers that only take note turn that into a clean exit 0
    instead of a KeyboardInterrupt or a death by SIGTERM.
    """
    received: list[int] = []

    def take_note(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, take_note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
    if not received:
        print(f"{ERROR_PREFIX}the sandbox stopped without a signal (see the log above)", file=sys.stderr)
        return 1
    return 0


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())
