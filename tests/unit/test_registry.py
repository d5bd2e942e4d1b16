"""The handler API: decorator, registry, module loading, Job helpers and return types."""

from __future__ import annotations

import logging
import math
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

import serverless_worker
from serverless_worker import BusinessError, Continue, Job, Result, handler
from serverless_worker.errors import (
    ConfigurationError,
    JobCancelledError,
    ServerlessWorkerError,
    UnknownHandlerError,
)
from serverless_worker.job import MAX_LOG_LINES, MAX_LOG_MESSAGE_BYTES, CancelReason
from serverless_worker.job_control import cancel_job, runtime_job
from serverless_worker.model import AppendedStage, ContextUpdate, ResultLog
from serverless_worker.registry import (
    HandlerRegistry,
    HandlerSpec,
    default_registry,
    get_handler,
    load_handlers,
)
from serverless_worker.results import NotJsonSerializableError, to_jsonable
from serverless_worker.testing import FakeClock

EXAMPLES = Path(__file__).resolve().parents[2] / "functions" / "handlers"
RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def registry() -> Iterator[HandlerRegistry]:
    """An empty default registry for each test; whatever was registered before comes back after."""
    with default_registry.isolated() as reg:
        yield reg


class Order(BaseModel):
    order_id: str
    amount: float


# -- decorator -----------------------------------------------------------------------

def test_decorator_registers_a_spec_with_every_option_and_returns_the_function() -> None:
    def charge(job: Job[Order]) -> dict[str, Any]:
        return {"id": job.input.order_id}

    decorated = handler("payment-processor", input=Order, timeout=30, mode="slices",
                        criteria={"format": "jpg", "width": {"lte": 2000}})(charge)

    assert decorated is charge
    spec = get_handler("payment-processor")
    assert spec == HandlerSpec(name="payment-processor", fn=charge, input_model=Order, timeout=30.0,
                               mode="slices", criteria={"format": "jpg", "width": {"lte": 2000}})
    assert (spec.long_running, spec.callback) == (True, False)
    assert charge(Job(Order(order_id="o-1", amount=1))) == {"id": "o-1"}


def test_defaults_are_a_short_synchronous_handler_without_model() -> None:
    @handler("echo")
    def echo(job: Job[Any]) -> Any:
        return job.input

    spec = default_registry.get("echo")
    assert (spec.input_model, spec.timeout, spec.mode, spec.long_running, spec.criteria, spec.callback) == (
        None, None, "short", False, None, False)
    assert spec.is_async is False


def test_callback_mode_is_long_running() -> None:
    @handler("render", mode="callback")
    def render(job: Job[Any]) -> None:
        return None

    spec = default_registry.get("render")
    assert spec.callback is True
    assert spec.long_running is True


class Refund(BaseModel):
    refund_id: str


def test_the_input_model_comes_from_the_job_annotation() -> None:
    # This module has `from __future__ import annotations`: the annotation is a string here.
    @handler("annotated")
    def charge(job: Job[Order]) -> str:
        return job.input.order_id

    assert default_registry.get("annotated").input_model is Order


def test_input_and_an_agreeing_annotation_are_accepted() -> None:
    @handler("both", input=Order)
    def charge(job: Job[Order]) -> None:
        return None

    assert default_registry.get("both").input_model is Order


@pytest.mark.parametrize("annotation", ["Job", "Job[dict]", "Job[dict[str, Any]]", "Job[Any]", None])
def test_a_job_without_a_model_gets_the_raw_payload(annotation: str | None) -> None:
    def fn(job):  # type: ignore[no-untyped-def]
        return job.input

    if annotation is not None:
        fn.__annotations__ = {"job": annotation}
    handler("raw")(fn)

    assert default_registry.get("raw").input_model is None


def test_input_that_disagrees_with_the_annotation_is_refused_naming_both_models() -> None:
    def refund(job: Job[Refund]) -> None:
        return None

    with pytest.raises(ConfigurationError) as caught:
        handler("mismatch", input=Order)(refund)

    message = str(caught.value)
    assert "'mismatch'" in message
    assert "input=Order" in message
    assert "Job[Refund]" in message
    assert "mismatch" not in default_registry


def test_input_with_a_raw_annotation_is_a_mismatch_too() -> None:
    def raw(job: Job[dict[str, Any]]) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"input=Order does not match the annotation Job\[dict"):
        handler("raw-vs-model", input=Order)(raw)


def test_an_unresolvable_annotation_is_a_clear_error_at_declaration() -> None:
    class Local(BaseModel):  # defined in a function: a string annotation cannot see it
        n: int

    def fn(job: Job[Local]) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"'unresolvable': cannot resolve the annotations .*"
                                                 r"NameError: name 'Local' is not defined"):
        handler("unresolvable")(fn)


def test_a_model_annotation_without_job_says_how_to_write_it() -> None:
    def fn(job: Order) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"annotate the parameter as Job\[Order\]"):
        handler("model-not-job")(fn)


@pytest.mark.parametrize(("option", "replacement"), [("long_running", 'mode="slices"'),
                                                     ("callback", 'mode="callback"')])
def test_the_removed_options_raise_a_type_error_naming_mode(option: str, replacement: str) -> None:
    options: dict[str, Any] = {option: True}
    with pytest.raises(TypeError, match=re.escape(f"{option}= was removed; declare {replacement}")):
        handler("old-style", **options)
    with pytest.raises(TypeError, match="mode="):
        HandlerRegistry().handler("old-style", **options)


def test_an_unknown_option_is_a_plain_type_error() -> None:
    options: dict[str, Any] = {"timout": 3}
    with pytest.raises(TypeError, match="unexpected keyword argument 'timout'"):
        handler("typo", **options)


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="mode= must be one of 'short', 'slices', 'callback'"):
        handler("bad-mode", mode="forever")(lambda job: None)  # type: ignore[arg-type]


def test_async_handlers_are_recognized() -> None:
    @handler("async-one")
    async def fn(job: Job[Any]) -> int:
        return 1

    assert default_registry.get("async-one").is_async is True


@pytest.mark.parametrize(("options", "fragment"), [
    ({"input": dict}, "input= must be a pydantic BaseModel subclass"),
    ({"input": Order(order_id="x", amount=1)}, "input= must be a pydantic BaseModel subclass"),
    ({"timeout": 0}, "timeout= must be a positive number"),
    ({"timeout": -1}, "timeout= must be a positive number"),
    ({"timeout": math.nan}, "timeout= must be a positive number"),
    ({"timeout": True}, "timeout= must be a positive number"),
    ({"timeout": "30"}, "timeout= must be a positive number"),
    ({"criteria": ["jpg"]}, "criteria= must be a dict"),
    ({"criteria": {1: "x"}}, "criteria= must be a dict with string keys"),
    ({"criteria": {"x": object()}}, "criteria= must be JSON-serializable"),
])
def test_invalid_options_are_rejected_at_declaration(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(fragment)) as caught:
        handler("bad-options", **options)(lambda job: None)
    assert "'bad-options'" in str(caught.value)
    assert "bad-options" not in default_registry


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", "a/b", "x" * 129, "naïve"])
def test_invalid_names_are_rejected(name: str) -> None:
    with pytest.raises(ConfigurationError, match="handler name"):
        handler(name)(lambda job: None)


@pytest.mark.parametrize("name", ["payment-processor", "payment:charge", "CustomHttpHandler", "a.b_c",
                                  "x" * 128])
def test_names_usable_by_every_protocol_are_accepted(name: str) -> None:
    handler(name)(lambda job: None)
    assert name in default_registry


def test_a_function_that_cannot_take_the_job_is_rejected() -> None:
    def no_args() -> None:
        return None

    def two_args(job: Job[Any], other: int) -> None:
        return None

    for fn in (no_args, two_args):
        with pytest.raises(ConfigurationError, match="exactly one argument"):
            handler(f"h-{fn.__name__}")(fn)


# -- registry ------------------------------------------------------------------------

def test_a_second_function_under_the_same_name_raises_naming_both() -> None:
    @handler("dup")
    def first(job: Job[Any]) -> None:
        return None

    def second(job: Job[Any]) -> None:
        return None

    with pytest.raises(ConfigurationError, match="already registered") as caught:
        handler("dup")(second)
    assert "first" in str(caught.value)
    assert "second" in str(caught.value)
    assert default_registry.get("dup").fn is first


def test_registering_the_same_spec_twice_is_a_no_op() -> None:
    def fn(job: Job[Any]) -> None:
        return None

    spec = HandlerSpec(name="same", fn=fn)
    default_registry.register(spec)
    default_registry.register(HandlerSpec(name="same", fn=fn))
    assert default_registry.names() == ["same"]


def test_unknown_handler_error_lists_the_known_names() -> None:
    handler("echo")(lambda job: None)
    handler("payment-processor")(lambda job: None)

    with pytest.raises(UnknownHandlerError) as caught:
        default_registry.get("nope")

    err = caught.value
    assert isinstance(err, ServerlessWorkerError)
    assert isinstance(err, LookupError)
    assert err.name == "nope"
    assert err.known == ("echo", "payment-processor")
    assert str(err) == "no handler named 'nope' (known handlers: 'echo', 'payment-processor')"


def test_unknown_handler_in_an_empty_registry_says_so() -> None:
    with pytest.raises(UnknownHandlerError, match="none registered"):
        HandlerRegistry().get("x")


def test_a_private_registry_is_separate_from_the_default_one() -> None:
    mine = HandlerRegistry()

    @handler("private", registry=mine)
    def fn(job: Job[Any]) -> None:
        return None

    assert "private" in mine
    assert len(mine) == 1
    assert [s.name for s in mine] == ["private"]
    assert "private" not in default_registry


def test_clear_empties_the_registry() -> None:
    handler("a")(lambda job: None)
    default_registry.clear()
    assert default_registry.names() == []


def test_isolated_restores_what_was_registered_before() -> None:
    reg = HandlerRegistry()
    reg.handler("kept")(lambda job: None)
    with reg.isolated():
        assert reg.names() == []
        reg.handler("temporary")(lambda job: None)
    assert reg.names() == ["kept"]


# -- loading the user's module -------------------------------------------------------------

HANDLER_FILE = textwrap.dedent('''
    from pydantic import BaseModel
    from serverless_worker import Job, handler

    class In(BaseModel):
        n: int

    @handler("{name}", input=In)
    def double(job: Job[In]) -> int:
        return job.input.n * 2
''')


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_load_a_file_by_path_without_touching_sys_path(tmp_path: Path) -> None:
    path = _write(tmp_path / "my_handlers.py", HANDLER_FILE.format(name="double"))
    before = list(sys.path)

    module = load_handlers(str(path))

    assert sys.path == before
    spec = default_registry.get("double")
    assert spec.fn.__module__ == module.__name__
    assert spec.input_model is not None
    assert spec.fn(Job(spec.input_model(n=21))) == 42


def test_loading_twice_does_not_rerun_the_module_and_re_registers_after_clear(tmp_path: Path) -> None:
    source = HANDLER_FILE.format(name="twice") + "\nRUNS = globals().get('RUNS', 0) + 1\n"
    path = _write(tmp_path / "twice.py", source)

    first = load_handlers(path)
    default_registry.clear()
    second = load_handlers(path)

    assert second is first
    assert first.RUNS == 1
    assert default_registry.names() == ["twice"]


def test_two_files_registering_one_name_are_named_by_file_and_line_not_by_module(tmp_path: Path) -> None:
    # given two handler files that both register "dup"
    first = _write(tmp_path / "dup.py", HANDLER_FILE.format(name="dup"))
    second = _write(tmp_path / "dup_again.py", HANDLER_FILE.format(name="dup"))
    mine = HandlerRegistry()
    load_handlers(first, registry=mine)

    # when the second is loaded into the same registry
    with pytest.raises(ConfigurationError, match="already registered") as caught:
        load_handlers(second, registry=mine)

    # then the message names each file and line, never the private module they load under
    message = str(caught.value)
    assert "_sw_handlers" not in message, message
    assert f"{first}:" in message and f"{second}:" in message and "double" in message, message


def test_load_into_a_given_registry(tmp_path: Path) -> None:
    path = _write(tmp_path / "given.py", HANDLER_FILE.format(name="given"))
    mine = HandlerRegistry()

    load_handlers(path, registry=mine)

    assert mine.names() == ["given"]


def test_load_a_package_directory_with_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "jobs"
    _write(pkg / "__init__.py", "from . import billing\n")
    _write(pkg / "billing.py", HANDLER_FILE.format(name="bill") + "\nfrom .util import TAX\n")
    _write(pkg / "util.py", "TAX = 0.2\n")

    load_handlers(pkg)

    assert default_registry.names() == ["bill"]


def test_load_by_dotted_module_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "dotted_pkg" / "__init__.py", "from .inner import *\n")
    _write(tmp_path / "dotted_pkg" / "inner.py", HANDLER_FILE.format(name="dotted"))
    monkeypatch.syspath_prepend(str(tmp_path))

    module = load_handlers("dotted_pkg")

    assert module.__name__ == "dotted_pkg"
    assert default_registry.names() == ["dotted"]


def test_a_missing_module_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"could not load handler module 'no_such_handlers_mod'"):
        load_handlers("no_such_handlers_mod")
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_handlers(tmp_path / "absent.py")
    with pytest.raises(ConfigurationError, match=r"has no __init__\.py"):
        load_handlers(tmp_path)


def test_a_broken_module_is_a_configuration_error_and_is_not_left_half_imported(tmp_path: Path) -> None:
    path = _write(tmp_path / "broken.py", "def oops(:\n")
    before = set(sys.modules)

    with pytest.raises(ConfigurationError, match="SyntaxError"):
        load_handlers(path)

    assert set(sys.modules) == before


def test_the_example_handlers_load_and_declare_what_the_docs_say() -> None:
    load_handlers(EXAMPLES)

    assert default_registry.names() == ["echo", "payment-processor", "sleepy", "slow-report"]
    assert default_registry.get("payment-processor").input_model is not None
    assert default_registry.get("slow-report").long_running is True
    assert default_registry.get("echo").long_running is False


# -- Job -------------------------------------------------------------------------

def test_remaining_counts_down_to_zero_and_is_infinite_without_deadline() -> None:
    clock = FakeClock()
    job = runtime_job(None, deadline=clock.monotonic() + 10, clock=clock)

    assert job.remaining() == 10
    clock.advance(4)
    assert job.remaining() == 6
    clock.advance(100)
    assert job.remaining() == 0
    assert Job(None).remaining() == math.inf


def test_wait_sleeps_when_not_cancelled() -> None:
    job = Job(None)
    started = time.monotonic()
    assert job.wait(0.05) is False
    assert time.monotonic() - started >= 0.04


def test_wait_wakes_early_on_cancellation() -> None:
    import threading

    job = Job(None)
    threading.Timer(0.05, cancel_job, args=(job, "lease_lost")).start()
    started = time.monotonic()

    assert job.wait(30) is True
    assert time.monotonic() - started < 15  # woken by the cancel, not the 30 s wait
    assert job.cancelled is True
    assert job.cancel_reason == "lease_lost"


def test_first_cancel_reason_wins_and_raise_if_cancelled_carries_it() -> None:
    job = Job(None)
    job.raise_if_cancelled()  # not cancelled: nothing happens

    cancel_job(job, CancelReason.TIMEOUT)
    cancel_job(job, "shutdown")

    assert job.cancel_reason is CancelReason.TIMEOUT
    with pytest.raises(JobCancelledError) as caught:
        job.raise_if_cancelled()
    assert caught.value.reason == "timeout"


def test_unknown_cancel_reasons_are_refused() -> None:
    with pytest.raises(ValueError):
        cancel_job(Job(None), "bored")


def test_progress_calls_the_reporter_and_dumps_models() -> None:
    seen: list[Any] = []
    job = runtime_job(None, reporter=seen.append)

    assert job.progress({"percent": 40}) is True
    assert job.progress(Order(order_id="o", amount=2)) is True

    assert seen == [{"percent": 40}, {"order_id": "o", "amount": 2.0}]


def test_progress_swallows_reporter_errors_and_logs_them(caplog: pytest.LogCaptureFixture) -> None:
    def broken(value: Any) -> None:
        raise ConnectionError("down")

    job = runtime_job(None, job_id="j-9", reporter=broken)
    with caplog.at_level(logging.WARNING, logger="serverless_worker.job"):
        assert job.progress({"percent": 1}) is False

    [record] = caplog.records
    assert "ConnectionError" in record.getMessage()
    assert record.job_id == "j-9"  # type: ignore[attr-defined]


def test_progress_is_not_sent_once_cancelled_or_without_reporter() -> None:
    seen: list[Any] = []
    job = runtime_job(None, reporter=seen.append)
    cancel_job(job, "lease_lost")

    assert job.progress({"percent": 50}) is False
    assert Job(None).progress({"percent": 50}) is False
    assert seen == []


def test_log_collects_result_lines_and_logs_with_correlation_keys(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(datetime(2025, 1, 31, 12, 0, 0, 123000, tzinfo=UTC).timestamp())
    job = runtime_job(None, job_id="j-1", ledger_id="L-1", protocol="pipelogiq", handler="echo", attempt=2,
                      clock=clock)

    with caplog.at_level(logging.DEBUG, logger="serverless_worker.job"):
        job.log("started")
        job.log("careful", level="warn")

    assert job.logs == [
        ResultLog(message="started", logLevel="INFO", created="2025-01-31T12:00:00.123Z"),
        ResultLog(message="careful", logLevel="WARN", created="2025-01-31T12:00:00.123Z"),
    ]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, "started"),
                                                                    (logging.WARNING, "careful")]
    record = caplog.records[0]
    assert (record.job_id, record.ledger_id, record.handler, record.protocol, record.attempt) == (  # type: ignore[attr-defined]
        "j-1", "L-1", "echo", "pipelogiq", 2)


def test_log_lines_are_bounded_in_size_and_number() -> None:
    job = Job(None)
    job.log("é" * MAX_LOG_MESSAGE_BYTES)
    for i in range(MAX_LOG_LINES + 4):
        job.log(f"line {i}")

    logs = job.logs
    assert len(logs[0].message.encode()) <= MAX_LOG_MESSAGE_BYTES
    assert logs[0].message.endswith("[truncated]")
    assert len(logs) == MAX_LOG_LINES + 1
    assert logs[-1].message == "5 more log lines were dropped"
    assert RFC3339_UTC.match(logs[-1].created)


def test_job_identity_defaults_and_repr_hide_input_and_token() -> None:
    job = Job({"card": "4111-secret"}, job_id="k", callback_token="tok-secret")

    assert job.ledger_id == "k"
    assert job.log_context["job_id"] == "k"
    assert "secret" not in repr(job)


# -- return types --------------------------------------------------------------------

def test_result_extras_take_every_pipelogiq_addition() -> None:
    result = Result(
        {"ok": True},
        logs=["plain", {"message": "warned", "logLevel": "WARN"},
              ResultLog(message="given", created="2024-01-01T00:00:00Z")],
        context={"customer": "c-42", "limits": {"max": 3}, "token": SecretStr("s3"),
                 "custom": ContextUpdate(key="ignored", value="v", valueType="string")},
        delete_context=["temporary"],
        append_stages=[{"stageName": "notify", "stageHandlerName": "notify", "input": {"to": "ops"}},
                       AppendedStage(stageName="audit", stageHandlerName="audit", input="x")],
        wait_for_approval=True,
    )

    extras = result.to_extras(now=0)

    assert [(line.message, line.logLevel) for line in extras.logs] == [
        ("plain", "INFO"), ("warned", "WARN"), ("given", "INFO")]
    assert extras.logs[0].created == "1970-01-01T00:00:00.000Z"
    assert [c.model_dump(exclude_none=True) for c in extras.context] == [
        {"key": "customer", "value": "c-42"},
        {"key": "limits", "value": '{"max": 3}', "valueType": "json"},
        {"key": "token", "value": "s3", "isSensitive": True},
        {"key": "custom", "value": "v", "valueType": "string"},
        {"key": "temporary", "isDeleted": True},
    ]
    assert [(s.stageName, s.input) for s in extras.appended_stages] == [
        ("notify", '{"to": "ops"}'), ("audit", "x")]
    assert extras.wait_for_approval is True


def test_continue_validates_its_delay() -> None:
    assert Continue({"page": 2}).delay_seconds == 0
    for bad in (-1, math.inf, math.nan):
        with pytest.raises(ValueError, match="delay_seconds"):
            Continue(None, delay_seconds=bad)
    with pytest.raises(TypeError):
        Continue(None, delay_seconds="5")  # type: ignore[arg-type]


def test_to_jsonable_normalizes_like_pydantic_and_names_what_it_cannot() -> None:
    assert to_jsonable(Order(order_id="o", amount=1)) == {"order_id": "o", "amount": 1.0}
    assert to_jsonable({"at": datetime(2025, 1, 1, tzinfo=UTC), "t": (1, 2)}) == {
        "at": "2025-01-01T00:00:00Z", "t": [1, 2]}
    with pytest.raises(NotJsonSerializableError, match=r"^object$"):
        to_jsonable(object())
    with pytest.raises(NotJsonSerializableError, match=re.escape("dict (contains <class 'object'>)")):
        to_jsonable({"x": object()})
    with pytest.raises(NotJsonSerializableError, match="float"):
        to_jsonable(math.nan)


def test_the_package_exports_exactly_the_handler_authors_api() -> None:
    assert sorted(serverless_worker.__all__) == ["BusinessError", "CancelReason", "Continue", "Job",
                                                 "JobCancelledError", "Result", "handler"]
    assert serverless_worker.handler is handler
    assert serverless_worker.BusinessError is BusinessError
    for name in serverless_worker.__all__:
        assert getattr(serverless_worker, name) is not None
    with pytest.raises(AttributeError):
        serverless_worker.no_such_name  # noqa: B018


@pytest.mark.parametrize("name", ["HandlerSpec", "HandlerRegistry", "default_registry", "load_handlers"])
def test_registry_internals_are_imported_from_their_module_not_the_package(name: str) -> None:
    import serverless_worker.registry

    assert getattr(serverless_worker.registry, name) is not None
    with pytest.raises(AttributeError):
        getattr(serverless_worker, name)


def test_runtime_only_job_members_are_not_public() -> None:
    job = Job(None)
    assert not hasattr(job, "cancel")
    for removed in ("clock", "progress_reporter"):
        with pytest.raises(TypeError):
            Job(None, **{removed: None})
