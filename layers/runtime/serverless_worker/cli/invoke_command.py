"""``serverless-worker invoke FUNCTION --event FILE``: run one Lambda function in-process.

The in-process twin of ``sam local invoke``: the handler, code directory, timeout and
environment come from template.yaml (``serverless_worker.stack`` resolves it as SAM
does), the handler module is imported the way the Lambda runtime imports it (the
function's CodeUri first on ``sys.path``), and it runs with a Lambda-like context that
counts down from the function's Timeout. The return value is printed as JSON on stdout;
the function's logs go to stderr. No container, no build: a quick loop for handlers and
events, against a sandbox and a local DynamoDB (``AWS_ENDPOINT_URL``) or a real account.

Example::

    serverless-worker invoke SchedulerFunction --event events/scheduler.json \\
        --parameter-overrides BaseUrl=http://127.0.0.1:8081 PollWindowSeconds=5
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, ServerlessWorkerError

__all__ = ["register", "run"]

PROG = "serverless-worker invoke"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``invoke`` subcommand."""
    parser = subparsers.add_parser(
        "invoke",
        help="run one function of template.yaml in-process with an event (like sam local invoke)",
        description="Run a function of template.yaml in this process with a Lambda-like context: "
                    "its handler, CodeUri, Timeout and environment come from the template (Globals "
                    "merged, intrinsics resolved). Prints the return value as JSON on stdout and the "
                    "logs on stderr. AWS calls go wherever boto3 is pointed (AWS_ENDPOINT_URL, AWS_PROFILE).",
    )
    parser.add_argument("function", metavar="FUNCTION",
                        help="the function's logical id, e.g. SchedulerFunction, ExecutorFunction, "
                             "StepsFunction, DrainFunction")
    parser.add_argument("-e", "--event", metavar="FILE.json",
                        help="the event as a JSON file ('-' reads stdin); default {}")
    parser.add_argument("--parameter-overrides", nargs="+", action="extend", default=[],
                        metavar="KEY=VALUE",
                        help="template parameter values as sam spells them: Key=Value pairs or "
                             "ParameterKey=Key,ParameterValue=Value (repeatable)")
    parser.add_argument("-n", "--env-vars", type=Path, metavar="FILE.json",
                        help='environment overrides in sam\'s format: {"FunctionLogicalId": {"VAR": '
                             '"value"}, "Parameters": {"VAR": "value"}} (only variables the template '
                             "declares, as with sam)")
    parser.add_argument("-t", "--template", type=Path, default=Path("template.yaml"), metavar="PATH",
                        help="the SAM template (default: ./template.yaml)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Resolve, prepare the environment, import, invoke, print; 0 on success, 1 on an unhandled error."""
    from ..runtime.context import LocalContext
    from ..stack import ResolvedTemplate, function_environment, load_env_vars_file, parse_parameter_overrides

    overrides = parse_parameter_overrides(args.parameter_overrides)
    template = ResolvedTemplate.load(args.template, overrides=overrides)
    function = template.function(args.function)
    event = _read_event(args.event)
    env_vars = load_env_vars_file(args.env_vars) if args.env_vars else None
    environment, ignored = function_environment(function, env_vars)
    for name in ignored:
        print(f"{PROG}: note: --env-vars sets {name}, which template.yaml does not declare for "
              f"{function.logical_id}; ignored, as sam local invoke would", file=sys.stderr)
    os.environ.update(environment)
    _configure_logging(environment.get("SW_LOG_LEVEL") or os.environ.get("SW_LOG_LEVEL") or "INFO")

    context = LocalContext(function_name=function.function_name, timeout_seconds=float(function.timeout),
                           memory_limit_in_mb=function.memory_size, invoked_function_arn=function.arn)
    started = time.monotonic()
    # Everything the function prints (Powertools' JSON logs, print()) goes to stderr, so stdout
    # carries only the return value.
    with contextlib.redirect_stdout(sys.stderr):
        entry = _import_handler(function)
        try:
            result = entry(event, context)
        except ServerlessWorkerError:
            raise  # main() prints it as one line and exits 2
        except Exception as err:
            traceback.print_exc(file=sys.stderr)
            error = {"errorType": type(err).__name__, "errorMessage": str(err)}
            print(json.dumps(error), file=sys.__stdout__ if sys.__stdout__ else sys.stderr, flush=True)
            return 1
        finally:
            elapsed = (time.monotonic() - started) * 1000
            print(f"END {function.logical_id} ({function.handler}) duration {elapsed:.0f} ms "
                  f"of {function.timeout} s", file=sys.stderr, flush=True)
    print(json.dumps(result, indent=2, default=str), flush=True)
    return 0


def _read_event(source: str | None) -> Any:
    if source is None:
        return {}
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigurationError(f"cannot read --event {source}: {err.strerror or err}") from err
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as err:
        raise ConfigurationError(f"--event {source} is not valid JSON: {err}") from err


def _import_handler(function: Any) -> Any:
    """Import ``module.attr`` as the Lambda runtime does: the code directory first on sys.path."""
    if not function.source.is_file():
        raise ConfigurationError(f"{function.logical_id}: handler {function.handler} expects "
                                 f"{function.source}, which does not exist (CodeUri {function.code_dir})")
    code_dir = str(function.code_dir)
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    try:
        module = importlib.import_module(function.module)
    except Exception as err:
        raise ConfigurationError(f"{function.logical_id}: cannot import {function.module} from {code_dir}: "
                                 f"{type(err).__name__}: {err}") from err
    entry = getattr(module, function.attribute, None)
    if not callable(entry):
        raise ConfigurationError(f"{function.logical_id}: {function.module} has no function "
                                 f"{function.attribute!r}")
    return entry


def _configure_logging(level: str) -> None:
    """The library's loggers to stderr at the function's level; botocore stays quiet."""
    name = level.upper() if level.upper() in logging.getLevelNamesMapping() else "INFO"
    logging.basicConfig(stream=sys.stderr, level=name, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
