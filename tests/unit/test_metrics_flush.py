"""Unit tier: the EMF flush is safe when invocations overlap in one process.

In Lambda one invocation runs at a time, but the local runner and the AWS test tier run
executors on threads that share the module's ``Metrics``. Two flushes interleaving on one
Powertools ``Metrics`` let the second find its metrics already emitted by the first, and
Powertools raises ``SchemaValidationError`` on an empty flush; a job must never fail over
its metrics.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest

from serverless_worker.runtime.metrics import Metrics


def test_overlapping_flushes_emit_every_count_and_never_raise(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # given Metrics in a Lambda environment, and eight threads adding and flushing at once
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "executor")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "ServerlessWorker")
    monkeypatch.setenv("POWERTOOLS_SERVICE_NAME", "test")
    metrics = Metrics()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def invocations() -> None:
        start.wait()
        for _ in range(150):
            try:
                metrics.add("Jobs_reported")
                metrics.flush()
            except Exception as err:  # what the race raised
                errors.append(err)

    # when they run, switching threads as often as the interpreter can
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=invocations) for _ in range(8)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)

    # then none raised, and the EMF records printed add up to every count
    assert errors == []
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    # (a metric added twice before one flush is printed as a list of its values)
    values = [record["Jobs_reported"] for record in records]
    assert sum(sum(v) if isinstance(v, list) else v for v in values) == 8 * 150
    assert metrics.totals["Jobs_reported"] == 8 * 150
