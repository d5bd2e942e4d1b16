"""The sandboxes' admin API refuses what it does not understand, in words a person can act on.

A misspelt field in a seed used to be dropped (Pipelogiq: the job ran with no retries) or
answered with pydantic's multi-line text and documentation links (Priostack, the claim
queue). Each must now be a 400 whose JSON names the field and the one it resembles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import requests

from serverless_worker.sandbox._server import SandboxServer

MISSPELT_SEEDS: list[tuple[str, Any, str]] = [
    ("pipelogiq", {"handler": "echo", "inputs": [{}], "options": {"maxRetrys": 2}},
     "unknown field 'maxRetrys' in options (did you mean 'maxRetries'?)"),
    ("pipelogiq", {"handler": "echo", "input": [{}]},
     "unknown field 'input' (did you mean 'inputs'?)"),
    ("pipelogiq", {"pipelines": [{"name": "p", "stages": [{"stageName": "a", "stageHandler": "echo"}]}]},
     "unknown field 'stageHandler' in pipelines[0].stages[0] (did you mean 'stageHandlerName'?)"),
    ("priostack", {"jobs": [{"type": "echo", "retrys": 2}]},
     "unknown field 'retrys' in jobs[0] (did you mean 'retries'?)"),
    ("priostack", {"job": [{"type": "echo"}]},
     "unknown field 'job' (did you mean 'jobs'?)"),
    ("claimqueue", {"queue": "resize", "itmes": [{}]},
     "unknown field 'itmes' (did you mean 'items'?)"),
]


def post(server: SandboxServer, path: str, body: Any) -> requests.Response:
    return requests.post(f"{server.url}/_admin/{path}", json=body, timeout=5)


@pytest.mark.parametrize(("protocol", "body", "message"), MISSPELT_SEEDS)
def test_a_misspelt_seed_field_is_a_short_400(serve: Callable[..., SandboxServer], protocol: str, body: Any,
                                              message: str) -> None:
    server = serve(protocol)

    answer = post(server, "jobs", body)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert message in error
    assert "pydantic" not in error and "http" not in error and "\n" not in error
    assert requests.get(f"{server.url}/_admin/jobs", timeout=5).json()["jobs"] == []


@pytest.mark.parametrize(("protocol", "body", "message"), [
    ("priostack", {"jobs": [{"type": "echo", "count": 0}]}, "jobs[0].count: Input should be greater than"),
    ("pipelogiq", {"handler": "echo", "inputs": [{}], "options": {"maxRetries": -1}},
     "options.maxRetries: Input should be greater than or equal to 0"),
    ("pipelogiq", ["not", "an", "object"], "body: Input should be a valid dictionary"),
])
def test_other_bad_values_name_their_place(serve: Callable[..., SandboxServer], protocol: str, body: Any,
                                           message: str) -> None:
    answer = post(serve(protocol), "jobs", body)

    assert answer.status_code == 400
    assert message in answer.json()["error"]


def test_good_seeds_still_create_jobs(serve: Callable[..., SandboxServer]) -> None:
    server = serve("pipelogiq")

    answer = post(server, "jobs", {"handler": "echo", "inputs": [{"n": 1}, {"n": 2}],
                                   "options": {"maxRetries": 2, "retryInterval": 5, "timeoutSeconds": 30},
                                   "raw": [{"queue": "12_echo_StageNext", "payload": "x"}]})

    assert answer.status_code == 201, answer.text
    created = answer.json()["created"]
    assert len(created["jobIds"]) == 2 and len(created["messageIds"]) == 1
    jobs = requests.get(f"{server.url}/_admin/jobs", timeout=5).json()["jobs"]
    assert [job["options"] for job in jobs] == [{"maxRetries": 2, "retryInterval": 5, "timeoutSeconds": 30}] * 2


def test_a_misspelt_fault_rule_or_config_field_is_refused(serve: Callable[..., SandboxServer]) -> None:
    server = serve("claimqueue")

    fault = post(server, "faults", {"rules": [{"kind": "error_5xx", "probabilty": 0.1}]})
    config = post(server, "config", {"lease_second": 5})

    assert fault.status_code == 400
    assert "unknown field 'probabilty' in rules[0] (did you mean 'probability'?)" in fault.json()["error"]
    assert config.status_code == 400
    assert "unknown field 'lease_second' (did you mean 'lease_seconds'?)" in config.json()["error"]
    assert requests.get(f"{server.url}/_admin/faults", timeout=5).json()["plan"]["rules"] == []


def test_switching_faults_off_keeps_the_log_of_what_fired(serve: Callable[..., SandboxServer]) -> None:
    # A run that switches its faults off to let the last work settle reads what fired afterwards.
    server = serve("priostack")
    post(server, "faults", {"seed": 1, "rules": [{"kind": "error_5xx", "endpoint": "*", "status": 503}]}
         ).raise_for_status()
    refused = requests.post(f"{server.url}/api/v1/jobs/activate", json={"type": "echo", "worker": "w", "timeout": 1000,
                                                                   "maxJobsToActivate": 1}, timeout=5)
    assert refused.status_code == 503
    off = requests.delete(f"{server.url}/_admin/faults", timeout=5).json()
    assert off["plan"]["rules"] == [] and [f["kind"] for f in off["fired"]] == ["error_5xx"], off
    assert requests.get(f"{server.url}/_admin/faults", timeout=5).json()["fired"] == off["fired"]
    post(server, "faults", {"seed": 2, "rules": []}).raise_for_status()  # a new plan starts a new log
    assert requests.get(f"{server.url}/_admin/faults", timeout=5).json()["fired"] == []
