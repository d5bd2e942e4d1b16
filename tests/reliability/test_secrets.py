"""No secret leaves the worker: the API key (read from Secrets Manager through Powertools
Parameters), the Pipelogiq session tokens and every delivery token stay out of every log
line (DEBUG included, stdout and stderr with Powertools' JSON logs and EMF), exception
text, Lambda invoke payload and answer, state-machine input, output and history, and
metric. Every secret here carries the marker ``SWSECRET``, so even a partial or
re-encoded copy of one is caught, and each run covers a full tick with jobs done, a key
rotation recovered by exactly one re-read, and (Pipelogiq) a long-running job through
the state machine and session re-bootstraps.

Also: plain ``http://`` is refused for anything but loopback unless explicitly allowed.
"""

from __future__ import annotations

import json
import logging
import secrets as real_secrets
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from reliability.conftest import HANDLERS, Env
from serverless_worker.errors import ConfigurationError
from serverless_worker.protocols._http import HttpTransport
from serverless_worker.protocols.factory import create_client
from serverless_worker.settings import Settings
from support.clock import SandboxClock
from support.waiting import poll

pytestmark = pytest.mark.aws

MARK = "SWSECRET"


class _Tokens:
    """Stands in for the ``secrets`` module of the Pipelogiq sandbox: session and delivery
    tokens that carry the marker, each recorded."""

    def __init__(self) -> None:
        self.issued: list[str] = []

    def token_urlsafe(self, nbytes: int = 32) -> str:
        kind = "session" if nbytes >= 32 else "delivery"
        value = f"{MARK}-{kind}-{len(self.issued)}-{real_secrets.token_urlsafe(12)}"
        self.issued.append(value)
        return value

    @staticmethod
    def token_hex(nbytes: int = 16) -> str:
        return real_secrets.token_hex(nbytes)


def _key(name: str) -> str:
    return f"{MARK}-{name}-{real_secrets.token_hex(8)}"


class _Evidence:
    """Everything a secret could leak into, gathered from one scenario."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}

    def add(self, name: str, value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
        self.sources[name] = self.sources.get(name, "") + text + "\n"

    def add_error(self, name: str, err: BaseException) -> None:
        self.add(name, "".join(traceback.format_exception(err)) + repr(err))

    def collect(self, env: Env, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
                ticks: list[Any]) -> None:
        from serverless_worker.runtime.metrics import metrics

        stack = env.stack
        stack.wait_idle()
        self.add("log records", caplog.text)
        self.add("log record args", [(r.name, r.msg, r.args, r.exc_text) for r in caplog.records])
        captured = capsys.readouterr()
        self.add("stdout (Powertools JSON logs, EMF)", captured.out)
        self.add("stderr", captured.err)
        self.add("lambda invoke payloads", [(i.function_name, i.invocation_type, i.event)
                                            for i in stack.lambdas.invocations])
        self.add("scheduler answers", ticks)
        for err in stack.lambdas.background_errors:
            self.add_error("executor exceptions", err)
        self.add("metric names", sorted(metrics.totals))
        for execution in stack.executions():
            arn = execution["executionArn"]
            described = stack.sfn.describe_execution(executionArn=arn)
            self.add("state-machine input/output", [described.get("input"), described.get("output")])
            self.add("state-machine history", stack.history(arn))

    def assert_captured(self) -> None:
        """The sources are real: DEBUG records of the worker and EMF metrics were captured."""
        assert "DEBUG" in self.sources["log records"] and "serverless_worker" in self.sources["log records"]
        assert '"_aws"' in self.sources["stdout (Powertools JSON logs, EMF)"]  # an EMF record
        assert self.sources["lambda invoke payloads"].count("ledger_key") >= 2

    def leaks(self, secrets: list[str]) -> list[str]:
        found = []
        for name, text in self.sources.items():
            for secret in [MARK, *secrets]:
                if secret in text:
                    at = text.index(secret)
                    found.append(f"{name}: {text[max(0, at - 120):at + 60]!r}")
                    break
        return found


@pytest.fixture
def evidence(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> _Evidence:
    caplog.set_level(logging.DEBUG)
    # Lambda's marker: metrics then flush as EMF to stdout, as in a deployed function.
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "serverless-worker-secrets-test")
    monkeypatch.setenv("POWERTOOLS_LOG_LEVEL", "DEBUG")
    return _Evidence()


def _run_until(env: Env, check: Callable[[], bool], ticks: list[Any], *, window: float = 2.0,
               limit: int = 5) -> None:
    """Scheduler ticks until ``check()`` holds; a loaded machine may need more than one."""
    for _ in range(limit):
        ticks.append(env.tick(window))
        env.stack.wait_idle()
        if poll(check, 5, interval=0.1):  # results apply asynchronously; executions take a moment
            return
    raise AssertionError(f"not done after {limit} ticks: {ticks[-limit:]}")


def _all_finished(env: Env) -> bool:
    jobs = env.admin.jobs()
    if env.protocol == "pipelogiq":
        return all(j["status"] in ("Completed", "Failed") for j in jobs)
    if env.protocol == "priostack":
        return all(j["state"] in ("completed", "incident") for j in jobs)
    return all(j["status"] in ("finished", "failed") for j in jobs)


def test_pipelogiq_secrets_stay_secret(worker_env: Callable[..., Env], secret_key: Callable[[str], Any],
                                       monkeypatch: pytest.MonkeyPatch, evidence: _Evidence,
                                       caplog: pytest.LogCaptureFixture,
                                       capsys: pytest.CaptureFixture[str], sandbox_clock: SandboxClock) -> None:
    from serverless_worker.sandbox import pipelogiq as sandbox_module

    tokens = _Tokens()
    monkeypatch.setattr(sandbox_module, "secrets", tokens)
    old, new = _key("old-api-key"), _key("new-api-key")
    env = worker_env("pipelogiq", handlers=["rel-echo", "rel-strict", "rel-slow-report"],
                     handler_module=HANDLERS,
                     sandbox={"api_keys": {old: 12}, "heartbeat_interval": 1, "session_ttl_seconds": 600},
                     settings={"log_level": "DEBUG"})
    key = secret_key(old)
    sandbox = env.server.sandbox
    ticks = []

    # 1. Jobs done: successes, a bad input, and a long-running job through the state machine.
    env.seed("rel-echo", [{"card": "4111111111111111"}, {"n": 2}, {"n": 3}])
    env.seed("rel-strict", [{"orderId": "", "amount": -1}])
    env.seed("rel-slow-report", [{"pages": 2}])
    _run_until(env, lambda: len(env.admin.jobs()) == 5 and _all_finished(env), ticks)
    env.stack.wait_for_executions(60)
    assert key.reads == 1, "the key is read once and then served from Powertools' cache"

    # 2. The key is rotated and the old one revoked, and then the session runs out on the
    #    server (its clock moves past the session's lifetime): the next tick's bootstrap,
    #    with the cached key, is rejected, the key is re-read once, and the worker goes on.
    key.rotate(new)
    env.admin.configure(api_keys={new: 12})
    bootstraps = sandbox.workers["worker-1"].bootstraps
    sandbox_clock.advance(601)
    env.seed("rel-echo", [{"n": 4}, {"n": 5}])
    _run_until(env, lambda: _all_finished(env), ticks)
    assert key.reads == 2, "a rejected key is re-read exactly once"
    assert sandbox.workers["worker-1"].bootstraps > bootstraps

    # 3. The server expires the session mid-tick: re-bootstrap, with the new key.
    env.admin.faults([{"kind": "expire_session", "endpoint": "heartbeat", "count": 1}])
    bootstraps = sandbox.workers["worker-1"].bootstraps
    env.seed("rel-echo", [{"n": 6}])
    _run_until(env, lambda: _all_finished(env), ticks)
    assert sandbox.workers["worker-1"].bootstraps > bootstraps
    assert key.reads == 2

    jobs = env.admin.jobs()
    assert sorted(j["status"] for j in jobs) == ["Completed"] * 7 + ["Failed"]
    assert len([t for t in tokens.issued if "-session-" in t]) >= 3
    assert len([t for t in tokens.issued if "-delivery-" in t]) >= 8
    evidence.collect(env, caplog, capsys, ticks)
    assert env.stack.executions(), "the long-running job went through the state machine"
    assert "state-machine history" in evidence.sources
    evidence.assert_captured()
    assert evidence.leaks([old, new, *tokens.issued]) == []


@pytest.mark.parametrize("protocol", ["priostack", "claimqueue"])
def test_api_key_and_token_stay_secret(protocol: str, worker_env: Callable[..., Env],
                                       secret_key: Callable[[str], Any], evidence: _Evidence,
                                       caplog: pytest.LogCaptureFixture,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    old, new = _key("old-key"), _key("new-key")
    credentials = {"priostack": "api_keys", "claimqueue": "tokens"}[protocol]
    env = worker_env(protocol, handlers=["rel-echo", "rel-strict"], handler_module=HANDLERS,
                     sandbox={credentials: [old]}, settings={"log_level": "DEBUG"})
    key = secret_key(old)
    ticks = []

    def seed(handler: str, inputs: list[Any], owner: str) -> None:
        if protocol == "priostack":  # a Priostack job belongs to the key that created it
            env.admin.seed({"jobs": [{"type": handler, "variables": v, "api_key": owner} for v in inputs]})
        else:
            env.seed(handler, inputs)

    seed("rel-echo", [{"card": "4111111111111111"}, {"n": 2}], old)
    seed("rel-strict", [{"orderId": "", "amount": -1}], old)
    _run_until(env, lambda: _all_finished(env), ticks)
    assert key.reads == 1

    key.rotate(new)
    env.admin.configure(**{credentials: [new]})
    seed("rel-echo", [{"n": 3}, {"n": 4}], new)
    _run_until(env, lambda: _all_finished(env), ticks)
    assert key.reads == 2, "a rejected key is re-read exactly once"
    assert len(env.admin.jobs()) == 5

    evidence.collect(env, caplog, capsys, ticks)
    evidence.assert_captured()
    assert evidence.leaks([old, new]) == []


def test_a_wrong_key_fails_clearly_without_showing_itself(worker_env: Callable[..., Env],
                                                          secret_key: Callable[[str], Any],
                                                          evidence: _Evidence,
                                                          caplog: pytest.LogCaptureFixture,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A key the server never accepts: one re-read finds the same key, the tick ends and
    says why, and neither the key nor the server's echo of it shows anywhere."""
    wrong = _key("wrong-key")
    env = worker_env("priostack", handlers=["rel-echo"], handler_module=HANDLERS,
                     settings={"log_level": "DEBUG"})
    key = secret_key(wrong)
    env.seed("rel-echo", [{"n": 1}])
    reports: list[Any] = []
    started = time.monotonic()
    _run_until(env, lambda: any(r["pulls"] for r in reports), reports)
    assert time.monotonic() - started < 10 * len(reports)
    report = reports[-1]
    assert report["stopped"] == "configuration: InvalidApiKeyError"
    assert any("API key rejected" in error for error in report["errors"])
    assert key.reads == 2  # the first read, and one re-read on the rejection
    assert env.admin.jobs()[0]["state"] == "waiting"  # nothing was taken
    evidence.collect(env, caplog, capsys, reports)
    assert evidence.leaks([wrong]) == []


# -- plain http:// ---------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["http://jobs.example.com", "HTTP://jobs.example.com:8080/api",
                                 "http://10.0.0.7", "http://localhost.example.com",
                                 "http://127.0.0.1.nip.io", "http://[::ffff:127.0.0.1]"])
def test_plain_http_to_a_remote_host_is_refused(url: str) -> None:
    with pytest.raises(ConfigurationError) as settings_error:
        Settings(base_url=url, api_key="k")
    assert "SW_BASE_URL: plain http:// is allowed only to loopback" in str(settings_error.value)
    assert "SW_ALLOW_INSECURE_HTTP" in str(settings_error.value)
    with pytest.raises(ConfigurationError, match="refusing plain http:// to non-loopback host"):
        HttpTransport(url)


@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack", "claimqueue"])
def test_every_client_refuses_plain_http_unless_allowed(protocol: str) -> None:
    remote = Settings(base_url="http://jobs.example.com", api_key="k", protocol=protocol,
                      allow_insecure_http=True)
    insecure = remote.model_copy(update={"allow_insecure_http": False})
    with pytest.raises(ConfigurationError, match="refusing plain http://"):
        create_client(insecure, remote.api_key)  # type: ignore[arg-type]
    create_client(remote, remote.api_key).close()  # type: ignore[arg-type]  # explicitly allowed


@pytest.mark.parametrize("url", ["http://127.0.0.1:8081", "http://localhost:8082", "http://[::1]:8083",
                                 "http://127.0.0.5", "https://jobs.example.com"])
def test_loopback_and_https_are_allowed(url: str) -> None:
    assert Settings(base_url=url, api_key="k").base_url == url
    HttpTransport(url).close()


def test_allowing_insecure_http_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SW_BASE_URL", "http://jobs.internal.example")
    monkeypatch.setenv("SW_API_KEY", "k")
    with pytest.raises(ConfigurationError):
        Settings()
    monkeypatch.setenv("SW_ALLOW_INSECURE_HTTP", "true")
    assert Settings().allow_insecure_http is True
