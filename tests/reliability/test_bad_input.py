"""Bad input of every kind gets a clear error message and a definite protocol outcome, and
never crashes the scheduler or keeps it busy past its window.

Two tiers: the AWS tier (``worker_env``: the real functions in moto against a sandbox)
where the outcome is a protocol call the sandbox records, and the protocol tier (a client
against a sandbox, or against a tiny raw HTTP server on loopback for answers no sandbox
gives: garbage bytes, truncated, oversized or trickled bodies, wrong shapes).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from reliability.conftest import HANDLERS, Env, handlers_module
from serverless_worker.errors import (
    ConfigurationError,
    ProtocolError,
    ProtocolViolationError,
    ServerUnavailableError,
    UnsupportedServerError,
)
from serverless_worker.model import SessionState
from serverless_worker.protocols.addressing import UNADDRESSABLE_PER_PULL
from serverless_worker.protocols.base import PullRequest
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.runtime.entry import reset_services
from serverless_worker.settings import Settings
from support.raw_http import read_request
from support.waiting import poll, wait_for

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
TICK = 3.0  # bootstrap, reap and heartbeat come first; at least a second must be left to pull
# A tick may end this much after its window: the last long poll's read timeout and teardown.
TICK_SLACK = 6.0


def _is_settled(env: Env, job: dict[str, Any]) -> bool:
    if env.protocol == "pipelogiq":
        return job["status"] in ("Completed", "Failed")
    if env.protocol == "priostack":  # completed, an incident, or failed back with one attempt used
        return job["state"] in ("completed", "incident") or bool(job["retries_history"][1:])
    return job["status"] in ("finished", "failed")


def _all_settled(env: Env) -> bool:
    return all(_is_settled(env, job) for job in env.admin.jobs())


def _ticks(env: Env, until: Callable[[], bool] | None = None, *, window: float = TICK,
           limit: int = 5) -> list[dict[str, Any]]:
    """Scheduler ticks until ``until()`` holds (by default: every job settled). Each tick
    must end within its window and leave no executor crash. (A loaded machine may need
    more than one tick before the first pull: the window also covers bootstrap and reaping.)"""
    check = until or (lambda: _all_settled(env))
    reports = []
    for _ in range(limit):
        started = time.monotonic()
        report = env.tick(window)
        assert time.monotonic() - started < window + TICK_SLACK, report
        env.stack.wait_idle()
        assert env.stack.lambdas.background_errors == []
        reports.append(report)
        if poll(check, 3, interval=0.1):  # results apply asynchronously
            return reports
    raise AssertionError(f"not done after {limit} ticks: {reports}")


def _settled(env: Env) -> list[dict[str, Any]]:
    """The sandbox's jobs once each has a final protocol outcome."""
    wait_for(lambda: _all_settled(env), what="every job to be settled")
    return env.admin.jobs()


def _pipelogiq_result(job: dict[str, Any]) -> dict[str, Any]:
    results = [h for h in job["history"] if h["event"] == "result_received"]
    assert len(results) == 1, job["history"]
    return results[0]


def _failure_text(env: Env, job: dict[str, Any]) -> tuple[str, str]:
    """(error code, message) of the failure a job was settled with, per protocol."""
    if env.protocol == "pipelogiq":
        result = _pipelogiq_result(job)
        return str(result["errorCode"]), str(result["result"])
    if env.protocol == "priostack":
        code, _, message = str(job["error_message"]).partition(": ")
        return code, message
    return str(job["result"]["errorCode"]), str(job["result"]["error"])


def _env(worker_env: Callable[..., Env], protocol: str, handlers: list[str], **kwargs: Any) -> Env:
    handlers_module().CALLS.clear()
    return worker_env(protocol, handlers=handlers, handler_module=HANDLERS, **kwargs)


# -- AWS tier: payloads ------------------------------------------------------------------------

@pytest.mark.aws
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_payload_failing_the_model_is_rejected_for_good(protocol: str,
                                                          worker_env: Callable[..., Env]) -> None:
    env = _env(worker_env, protocol, ["rel-strict"])
    env.seed("rel-strict", [{"orderId": "A-1", "amount": -5}, {"amount": "lots"},
                            {"orderId": "A-3", "amount": 7}])
    reports = _ticks(env)
    assert [r["errors"] for r in reports] == [[]] * len(reports)
    assert sum(r["dispatched"] for r in reports) == 3

    jobs = _settled(env)
    assert handlers_module().CALLS == {"rel-strict": 1}  # only the valid one ran
    failed = [j for j in jobs if "A-3" not in json.dumps(j.get("input", j.get("variables", j.get("item"))))]
    assert len(failed) == 2
    for job in failed:
        code, message = _failure_text(env, job)
        assert code == "VALIDATION_ERROR"
        assert "payload does not match Order" in message
        assert "amount" in message and "lots" not in message and "-5" not in message  # fields, no values
        if protocol == "pipelogiq":  # not retryable: failed at once, never retried
            assert job["status"] == "Failed" and job["failures"] == 1 and len(job["executions"]) == 1
            assert _pipelogiq_result(job)["retryable"] is False
        elif protocol == "priostack":  # fail with retries 0: an incident an operator sees
            assert job["state"] == "incident" and job["retries_history"] == [3, 0]
            assert job["incident"]["error_code"] == "JOB_FAILED"
        else:  # an in-band error result that finishes the item
            assert job["status"] == "finished" and job["attempts"] == 1


@pytest.mark.aws
def test_pipelogiq_input_that_is_not_json(worker_env: Callable[..., Env]) -> None:
    env = _env(worker_env, "pipelogiq", ["rel-strict", "rel-echo"])
    stages = [{"stageName": name, "stageHandlerName": name, "input": text, "options": {"maxRetries": 3}}
              for name, text in (("rel-strict", "{not json"), ("rel-strict", ""), ("rel-echo", "plain text"))]
    env.admin.seed({"pipelines": [{"name": f"p{i}", "stages": [stage]} for i, stage in enumerate(stages)]})
    _ticks(env)
    strict_bad, strict_empty, echo = _settled(env)
    for job in (strict_bad, strict_empty):  # a model needs JSON: VALIDATION_ERROR, never retried
        assert job["status"] == "Failed" and job["errorCode"] == "VALIDATION_ERROR" and job["failures"] == 1
        assert "payload does not match Order" in _pipelogiq_result(job)["result"]
    assert echo["status"] == "Completed" and echo["output"] == "plain text"  # no model: the text as is


@pytest.mark.aws
def test_pipelogiq_undecodable_deliveries_are_never_acknowledged_away(worker_env: Callable[..., Env]) -> None:
    """Messages no stage can be read from (not JSON, no stage address) cannot be leased
    or reported: among addressable ones, each is logged and left unacknowledged for the
    visibility timeout to return (never acked with requeue:false), and the tick goes on."""
    env = _env(worker_env, "pipelogiq", ["rel-echo"])
    queue = "app_12_rel-echo_StageNext"
    env.admin.seed({"pipelines": [{"name": "good", "stages": [
                        {"stageName": "rel-echo", "stageHandlerName": "rel-echo", "input": "{}"}]}],
                    "raw": [{"queue": queue, "payload": "{definitely not json"},
                            {"queue": queue, "payload": {"stageId": "seven", "attempt": 0}},
                            {"queue": queue, "payload": None}]})
    log = env.server.sandbox.log  # type: ignore[attr-defined]
    reports = _ticks(env)  # until the good stage is settled
    assert all(r["stopped"] is None for r in reports), reports
    assert [e["event"] for e in log].count("delivered") == 3
    assert not any(e["event"] in ("ack", "requeue") for e in log)
    assert handlers_module().CALLS == {"rel-echo": 1}


# -- AWS tier: results over the caps ---------------------------------------------------------------

@pytest.mark.aws
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_results_over_the_caps_become_result_too_large_failures(protocol: str,
                                                                worker_env: Callable[..., Env]) -> None:
    """Over Pipelogiq's 262,144-byte result cap (Pipelogiq only), and over the 400 KB the
    ledger can store (every protocol): a RESULT_TOO_LARGE failure is reported instead, as
    not retryable (the handler would return as much again), naming the handler and the job."""
    handlers = ["rel-huge", "rel-huge-item"] if protocol == "pipelogiq" else ["rel-huge-item"]
    env = _env(worker_env, protocol, handlers)
    for name in handlers:
        env.seed(name, [{"n": 1}], **_RETRIES[protocol])
    _ticks(env)
    jobs = _settled(env)
    assert len(jobs) == len(handlers)
    for job in jobs:
        code, message = _failure_text(env, job)
        assert code == "RESULT_TOO_LARGE"
        assert "bytes" in message and ("262144" in message or "409600" in message)
        assert len(message) < 2000  # the result itself is not echoed back
        assert "handler 'rel-huge" in message and f"(job {_job_id(env, job)})" in message
        _assert_not_retried(env, job)
    calls = handlers_module().CALLS
    assert calls == dict.fromkeys(handlers, 1)  # each ran once; its result never went out


@pytest.mark.aws
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_result_that_is_not_json_fails_for_good_naming_its_type(protocol: str,
                                                                  worker_env: Callable[..., Env]) -> None:
    """A handler returning a value JSON cannot hold: an INVALID_RESULT failure naming the
    handler, the job and the offending type, reported as not retryable on every protocol,
    though the server would retry a retryable failure (Pipelogiq maxRetries, Priostack retries)."""
    env = _env(worker_env, protocol, ["rel-not-json"])
    env.seed("rel-not-json", [{"n": 1}], **_RETRIES[protocol])
    _ticks(env)
    [job] = _settled(env)
    code, message = _failure_text(env, job)
    assert code == "INVALID_RESULT"
    assert message.startswith(f"handler 'rel-not-json' (job {_job_id(env, job)}) returned a value that is not "
                              "JSON-serializable: dict (contains ")
    assert "Opaque" in message
    _assert_not_retried(env, job)
    assert handlers_module().CALLS == {"rel-not-json": 1}


# Server-side retries a retryable failure would use.
_RETRIES: dict[str, dict[str, Any]] = {"pipelogiq": {"maxRetries": 2, "retryInterval": 0},
                                       "priostack": {"retries": 3}, "claimqueue": {}}


def _job_id(env: Env, job: dict[str, Any]) -> str:
    """The id the worker knows the job by (Delivery.job_id)."""
    if env.protocol == "pipelogiq":
        return str(job["job_id"])
    return str(job["key"] if env.protocol == "priostack" else job["id"])


def _assert_not_retried(env: Env, job: dict[str, Any]) -> None:
    """Settled for good after one run: no retry on the server."""
    if env.protocol == "pipelogiq":
        assert job["status"] == "Failed" and job["failures"] == 1 and len(job["executions"]) == 1
        assert _pipelogiq_result(job)["retryable"] is False
    elif env.protocol == "priostack":  # fail with retries 0: an incident at once
        assert job["state"] == "incident" and job["retries_history"] == [3, 0]
    else:  # an in-band error result, which finishes the item: the queue never offers it again
        assert job["status"] == "finished" and job["attempts"] == 1


# -- AWS tier: unknown handlers ---------------------------------------------------------------------

@pytest.mark.aws
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_job_for_an_unknown_handler_fails_naming_the_known_ones(protocol: str,
                                                                  worker_env: Callable[..., Env]) -> None:
    """SW_HANDLERS names a handler no module registered: its jobs fail (retryable, since a
    fixed deployment may run them) with a message that lists the handlers there are."""
    env = _env(worker_env, protocol, ["rel-ghost", "rel-echo"])
    env.seed("rel-ghost", [{"n": 1}])
    env.seed("rel-echo", [{"n": 2}])
    _ticks(env)
    jobs = _settled(env)
    ghost = next(j for j in jobs if "ghost" in json.dumps(j))
    code, message = _failure_text(env, ghost)
    assert code == "UNKNOWN_HANDLER"
    assert "no handler named 'rel-ghost'" in message and "'rel-echo'" in message
    if protocol == "priostack":  # each activation uses one attempt; the last ends in an incident
        history = ghost["retries_history"]
        assert history[:2] == [3, 2] and history == sorted(set(history), reverse=True)
    assert handlers_module().CALLS == {"rel-echo": 1}


# -- AWS tier: wrong-typed fields -------------------------------------------------------------------

@pytest.mark.aws
def test_priostack_numeric_keys_are_never_guessed_at(worker_env: Callable[..., Env],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A key that is a JSON number cannot address its job (converting it could address
    another one): nothing is sent for it; the documents' rule is that it stays active
    server-side until a restart. A server whose every job is so speaks another API: each
    tick stops after the activation that shows it, saying so."""
    env = _env(worker_env, "priostack", ["rel-echo"], sandbox={"numeric_keys": True})
    env.seed("rel-echo", [{"n": 1}, {"n": 2}])
    sandbox = env.server.sandbox
    reports = _ticks(env, lambda: sandbox.calls["activate"] >= 1)  # type: ignore[attr-defined]
    assert all(r["pulled"] == 0 and r["dispatched"] == 0 for r in reports)
    assert reports[-1]["stopped"] == "configuration: UnsupportedServerError", reports
    assert "activated jobs carry a key that is not a JSON string (int)" in reports[-1]["errors"][-1]
    assert "whose key is not a JSON string" in caplog.text and "type int" in caplog.text
    jobs = env.admin.jobs()
    assert [j["state"] for j in jobs] == ["active", "active"]
    assert all(j["calls"] == [] for j in jobs)  # no complete or fail went to any key
    assert handlers_module().CALLS == {}
    assert sandbox.calls["activate"] == len(reports)  # type: ignore[attr-defined]  # one per tick


@pytest.mark.aws
@pytest.mark.parametrize("override", [{"retries": "3"}, {"variables": ["not", "an", "object"]},
                                      {"processInstanceKey": 42}])
def test_priostack_wrong_typed_fields_fail_the_job_with_retries_zero(override: dict[str, Any],
                                                                     worker_env: Callable[..., Env]) -> None:
    env = _env(worker_env, "priostack", ["rel-echo"])
    env.admin.seed({"jobs": [{"type": "rel-echo", "variables": {"n": 1}, "wire_overrides": override}]})
    _ticks(env)
    (job,) = _settled(env)
    assert job["state"] == "incident" and job["retries_history"] == [3, 0]
    code, message = _failure_text(env, job)
    assert code == "VALIDATION_ERROR" and "invalid delivery" in message
    assert next(iter(override)) in message
    assert handlers_module().CALLS == {}


# -- AWS tier: garbage from the server ------------------------------------------------------------------

class RawServer:
    """A loopback HTTP server answering every request with the same raw bytes, for answers
    no sandbox produces. ``trickle`` sends the bytes, then one more byte every 0.2 s."""

    def __init__(self, raw: bytes, *, trickle: bool = False) -> None:
        self.raw, self.trickle = raw, trickle
        self.requests = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._stop = threading.Event()
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                if read_request(conn) is None:
                    return
                self.requests += 1
                conn.sendall(self.raw)
                deadline = time.monotonic() + 20
                while self.trickle and not self._stop.is_set() and time.monotonic() < deadline:
                    time.sleep(0.2)  # the behaviour under test: a server trickling bytes
                    conn.sendall(b" ")
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


def _http(status: str, body: bytes, *, length: int | None = None, extra: str = "") -> bytes:
    size = len(body) if length is None else length
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n"
            f"Connection: close\r\n{extra}\r\n")  # one answer per connection, as RawServer serves
    return head.encode() + body


HUGE = b'{"jobs": [' + b" " * (9 * 1024 * 1024) + b"]}"
ANSWERS: dict[str, tuple[bytes, bool, type[ProtocolError], str]] = {
    # name: (raw answer, trickle, error raised by the client, text in the error)
    "garbage bytes": (b"\x00\xff\xfe not http at all\r\n\r\n", False, ServerUnavailableError,
                      "transport failure"),
    "non-JSON body": (_http("200 OK", b"<html>502 Bad Gateway</html>"), False, ProtocolViolationError, ""),
    "truncated body": (_http("200 OK", b'{"jobs": [', length=400), False, ServerUnavailableError,
                       "transport failure"),
    "huge body": (_http("200 OK", HUGE), False, ProtocolViolationError, "response larger than 8388608 bytes"),
    "trickled body": (_http("200 OK", b"{", length=10_000), True, ServerUnavailableError,
                      "response body not complete"),
}


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def _start(raw: bytes, *, trickle: bool = False) -> RawServer:
        server = RawServer(raw, trickle=trickle)
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.close()


@pytest.mark.aws
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("answer", ["non-JSON body", "truncated body", "trickled body"])
def test_a_tick_against_a_broken_server_ends_on_time_and_says_why(protocol: str, answer: str,
                                                                  worker_env: Callable[..., Env],
                                                                  raw_server: Callable[..., RawServer],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    raw, trickle, _error, _text = ANSWERS[answer]
    server = raw_server(raw, trickle=trickle)
    env = _env(worker_env, protocol, ["rel-echo"], settings={"read_timeout": 1})
    monkeypatch.setenv("SW_BASE_URL", server.url)
    reset_services()
    reports = _ticks(env, lambda: server.requests >= 1)
    assert all(r["pulled"] == 0 and r["dispatched"] == 0 for r in reports)
    report = reports[-1]
    assert report["errors"], report
    where = "session: bootstrap" if protocol == "pipelogiq" else "pull: "
    assert all(e.startswith(where) for e in report["errors"]), report["errors"]
    if protocol == "pipelogiq":  # nothing works without a session: the tick ends at once
        # bootstrap is retried like a report (a repeated bootstrap is harmless), then given up
        assert report["stopped"].startswith("no session") and 1 <= server.requests <= 6
    else:  # a failed poll backs off as for a 5xx: a bounded number of tries per tick
        assert 1 <= server.requests <= 3


# -- protocol tier: garbage from the server, client by client ------------------------------------------------

def _client(protocol: str, url: str) -> Any:
    if protocol == "pipelogiq":
        client = PipelogiqClient(url, "key", read_timeout=1.0)
        now = time.time()
        client.use_session(SessionState(worker_id="w-1", token=SecretStr("s"), issued_at=now,
                                        expires_at=now + 600, attributes={"appId": "app_12"}))
        return client
    if protocol == "priostack":
        return PriostackClient(url, "key", read_timeout=1.0)
    return ClaimQueueClient(url, "token", read_timeout=1.0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_every_client_turns_a_broken_answer_into_a_clear_error(protocol: str, answer: str,
                                                               raw_server: Callable[..., RawServer],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    raw, trickle, error, text = ANSWERS[answer]
    server = raw_server(raw, trickle=trickle)
    started = time.monotonic()
    if protocol == "pipelogiq" and answer == "non-JSON body":
        # A 200 without a readable delivery token cannot be acted on (nor acknowledged): its
        # visibility timeout returns it. A bounded number more are pulled in its place, and
        # the lease API is asked once whether this is an older release (it answers: no).
        with _client(protocol, server.url) as client:
            assert client.pull(PullRequest(handler="rel-echo", max_items=3, wait_seconds=0)) == []
        assert server.requests == 3 + UNADDRESSABLE_PER_PULL + 1
        assert "cannot be addressed (no delivery token)" in caplog.text
        return
    with _client(protocol, server.url) as client, pytest.raises(ProtocolError) as info:
        client.pull(PullRequest(handler="rel-echo", max_items=3, wait_seconds=0))
    # Read timeout 1 s (a Pipelogiq pull waits 5 s more: the long poll's margin): nothing hangs.
    assert time.monotonic() - started < 15.0  # the read timeout ended it, not the 20 s trickle
    assert server.requests == 1  # a pull is never retried blindly
    if protocol == "claimqueue" and answer == "non-JSON body":
        error, text = ProtocolViolationError, "is not a JSON object"
    assert isinstance(info.value, error), repr(info.value)
    assert text in str(info.value)
    assert info.value.endpoint in ("pull", "activate", "claim")
    assert str(info.value).startswith(f"{info.value.endpoint}: ")


WRONG_SHAPES: dict[str, list[bytes]] = {
    "pipelogiq": [_http("200 OK", b'{"token": 7, "payload": {}}'), _http("200 OK", b"[1, 2]"),
                  _http("200 OK", b'{"token": "t", "payload": "{\\"stageId\\": \\"x\\"}"}')],
    "priostack": [_http("200 OK", b'{"jobs": "none"}'), _http("200 OK", b"[]"), _http("200 OK", b"null")],
    "claimqueue": [_http("200 OK", b'{"ok": true}'), _http("200 OK", b'{"ok": "yes", "id": 1}'),
                   _http("200 OK", b'{"ok": true, "id": "a", "attempts": 0}')],
}


# What each wrong shape must become: a ProtocolViolationError (no jobs list), an
# UnsupportedServerError (nothing addressable came: no item id), nothing (Pipelogiq: no
# token or stage address, left for the visibility timeout, as the server has a lease API),
# or a delivery marked invalid, which the runtime settles with a definite error outcome.
SHAPE_OUTCOMES: dict[str, list[str]] = {
    "pipelogiq": ["left", "left", "left"],
    "priostack": ["violation", "violation", "violation"],
    "claimqueue": ["unsupported", "invalid", "invalid"],
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("shape", [0, 1, 2])
def test_wrong_shaped_answers_deliver_nothing_runnable(protocol: str, shape: int,
                                                       raw_server: Callable[..., RawServer]) -> None:
    """JSON of the wrong shape never becomes a delivery a handler runs, and is never
    acknowledged away."""
    server = raw_server(WRONG_SHAPES[protocol][shape])
    expected = SHAPE_OUTCOMES[protocol][shape]
    with _client(protocol, server.url) as client:
        try:
            deliveries = client.pull(PullRequest(handler="rel-echo", max_items=1, wait_seconds=0))
        except ProtocolViolationError as err:
            assert expected == "violation" and ("answer" in str(err) or "not a JSON object" in str(err))
        except UnsupportedServerError as err:
            assert expected == "unsupported" and str(err).startswith(("deliveries carry", "claims carry")), err
        else:
            if expected == "left":
                assert deliveries == []
            else:
                assert expected == "invalid" and [bool(d.invalid) for d in deliveries] == [True]


# -- broken configuration -------------------------------------------------------------------------------

def test_settings_errors_name_each_bad_setting_and_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"SW_PROTOCOL": "carrier-pigeon", "SW_BASE_URL": "https://user:hunter2@jobs.example.com",
                        "SW_BATCH_SIZE": "0", "SW_MAX_IN_FLIGHT": "many", "SW_CRITERIA": "{oops",
                        "SW_HANDLERS": "ok,bad name!", "SW_API_KEY": "k-hunter3"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        Settings()
    message = str(info.value)
    for name in ("SW_PROTOCOL", "SW_BASE_URL", "SW_BATCH_SIZE", "SW_MAX_IN_FLIGHT", "SW_CRITERIA",
                 "SW_HANDLERS"):
        assert f"{name}:" in message, message
    assert "hunter2" not in message and "hunter3" not in message and "carrier-pigeon" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no chained pydantic error


@pytest.mark.aws
def test_a_broken_configuration_fails_the_invocation_naming_the_settings(
        worker_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch) -> None:
    env = _env(worker_env, "priostack", ["rel-echo"])
    env.seed("rel-echo", [{"n": 1}])
    monkeypatch.setenv("SW_BATCH_SIZE", "-1")
    monkeypatch.setenv("SW_POLL_WINDOW_SECONDS", "forever")
    reset_services()
    with pytest.raises(AssertionError) as info:
        env.tick(TICK)
    message = str(info.value)
    assert "ConfigurationError" in message
    assert "SW_BATCH_SIZE:" in message and "SW_POLL_WINDOW_SECONDS:" in message
    assert env.admin.jobs()[0]["state"] == "waiting"  # nothing was taken, nothing is stranded
    monkeypatch.delenv("SW_BATCH_SIZE")
    monkeypatch.delenv("SW_POLL_WINDOW_SECONDS")
    reset_services()
    _ticks(env)
    assert _settled(env)[0]["state"] == "completed"  # fixed configuration: the job runs
