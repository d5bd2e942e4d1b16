"""The Priostack API key never shows up in logs, exception texts, chained causes or reprs,
in any of the three auth modes (the query mode puts it in the URL)."""

from __future__ import annotations

import logging
import socket
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from serverless_worker.errors import (
    InvalidApiKeyError,
    NotFoundAfterRetryError,
    ServerlessWorkerError,
    ServerUnavailableError,
)
from serverless_worker.model import Outcome, OutcomeKind
from serverless_worker.protocols.base import PullRequest, WorkerIdentity, WorkerStatus
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

SECRET = "PSK-q9X7vT-distinctive-5e1f0a"
WRONG = "PSK-wrongKey-distinctive-7c2d"
FRAGMENTS = ("q9X7vT", "wrongKey")
ONE = PullRequest(handler="t", max_items=1)


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo += [cur.__cause__, cur.__context__]
        todo += [arg for arg in cur.args if isinstance(arg, BaseException)]
        todo += [value for value in vars(cur).values() if isinstance(value, BaseException)]


def _texts_of(err: BaseException) -> list[str]:
    texts = ["".join(traceback.format_exception(err))]
    for cur in _chain(err):
        texts += [str(cur), repr(cur), repr(cur.args), repr(vars(cur))]
    return texts


def _capture(fn: Callable[[], Any], expected: type[BaseException]) -> BaseException:
    with pytest.raises(expected) as caught:
        fn()
    return caught.value


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("auth", ["header", "bearer", "query"])
def test_the_api_key_never_appears_in_logs_errors_or_reprs(
    serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
    caplog: pytest.LogCaptureFixture, auth: str,
) -> None:
    caplog.set_level(logging.DEBUG)  # everything, the transport's request lines included
    server = serve("priostack", api_keys=[SECRET])
    admin = admin_for(server)
    texts: list[str] = []
    errors: list[BaseException] = []

    client = PriostackClient(server.url, SecretStr(SECRET), auth=auth, register=True, read_timeout=0.3)
    identity = WorkerIdentity(instance_id="i-1", handlers=["t"])
    client.open_session(identity)
    client.heartbeat(WorkerStatus())
    record = client.register_worker(["t"], "g")  # the answer echoes the key
    assert record.api_key is not None and record.api_key.get_secret_value() == SECRET
    workers = client.list_workers()
    texts += [repr(record), str(record), record.model_dump_json(), repr(record.model_dump()), repr(workers),
              workers.model_dump_json()]

    # Work, with a lost response, a retry, a 404 and the reconciliation read.
    admin.seed({"jobs": [{"type": "t", "count": 3}]})
    deliveries = client.pull(PullRequest(handler="t", max_items=3))
    admin.faults([{"kind": "drop_response", "endpoint": "complete", "count": 1}])
    receipt = client.report(deliveries[0], Outcome(kind=OutcomeKind.SUCCESS, value={"ok": 1}))
    assert receipt.already_applied
    errors.append(_capture(lambda: client.complete(deliveries[0].job_id), ServerlessWorkerError))
    admin.faults([{"kind": "drop_response", "endpoint": "fail", "count": 1}])
    errors.append(_capture(lambda: client.fail(deliveries[1].job_id, 0, "x"), NotFoundAfterRetryError))
    client.hand_back(deliveries[2])
    texts += [repr(receipt), repr(deliveries), repr(client), str(client), repr(vars(client)),
              repr(vars(client._transport))]

    # Failures of every kind: 5xx after retries, a dropped activation, a read timeout,
    # a rejected key, and a refused connection (whose transport error names the address).
    admin.faults([{"kind": "error_5xx", "endpoint": "complete"}])
    errors.append(_capture(lambda: client.complete("k"), ServerUnavailableError))
    admin.faults([{"kind": "drop_response", "endpoint": "activate", "count": 1}])
    errors.append(_capture(lambda: client.pull(ONE), ServerUnavailableError))
    admin.faults([{"kind": "latency", "endpoint": "activate", "latency_ms": 1000, "count": 1}])
    errors.append(_capture(lambda: client.pull(ONE), ServerUnavailableError))
    admin.clear_faults()
    wrong = PriostackClient(server.url, WRONG, auth=auth, register=True)
    errors.append(_capture(lambda: wrong.pull(ONE), InvalidApiKeyError))
    errors.append(_capture(lambda: wrong.open_session(identity), InvalidApiKeyError))
    texts += [repr(wrong), repr(vars(wrong))]
    wrong.close()
    refused = PriostackClient(_closed_port_url(), SECRET, auth=auth)
    refused_error = _capture(lambda: refused.pull(ONE), ServerUnavailableError)
    errors.append(refused_error)
    errors.append(_capture(lambda: refused.complete("k"), ServerUnavailableError))
    refused.close()
    client.close()

    for err in errors:
        texts += _texts_of(err)
    texts += [caplog.text]
    for log_record in caplog.records:
        texts += [log_record.getMessage(), repr(vars(log_record))]
        if log_record.exc_info and log_record.exc_info[1] is not None:
            texts += _texts_of(log_record.exc_info[1])

    blob = "\n".join(texts)
    for fragment in FRAGMENTS:
        assert fragment not in blob
    # The capture really saw the request lines and the errors it claims to check.
    assert any(r.name == "serverless_worker.http" and "http POST activate" in r.getMessage()
               for r in caplog.records)
    assert "transport failure (connection refused)" in blob
    if auth == "query":
        # Detached: the transport error of a call whose URL carries the key is not reachable at all.
        assert refused_error.__cause__ is None and refused_error.__context__ is None
    else:
        assert refused_error.__cause__ is not None  # kept where it carries no key


def test_the_key_is_masked_in_reprs_of_the_client_and_records() -> None:
    client = PriostackClient("http://127.0.0.1:9", SECRET)
    try:
        for text in (repr(client), str(client), repr(vars(client))):
            assert "q9X7vT" not in text
        assert "SecretStr('**********')" in repr(client)
    finally:
        client.close()
