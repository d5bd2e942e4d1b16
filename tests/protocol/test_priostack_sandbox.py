"""The Priostack sandbox against the documents, over raw HTTP on loopback.

These cover what the client never sends (bad bodies, missing keys, other actions), so
the sandbox that the client tests rely on is itself held to the worker documentation (docs/protocols.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

KEY = "sandbox-api-key"
API = "/api/v1"


class Raw:
    """Raw HTTP against one sandbox: what a hand-written worker would send."""

    def __init__(self, server: SandboxServer) -> None:
        self.url = server.url
        self.http = requests.Session()

    def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             key: str | None = KEY, how: str = "header") -> requests.Response:
        headers: dict[str, str] = {"Content-Type": "application/json"}
        params: dict[str, str] = {}
        if key is not None:
            if how == "header":
                headers["X-API-Key"] = key
            elif how == "bearer":
                headers["Authorization"] = f"Bearer {key}"
            else:
                params["api_key"] = key
        data = raw if raw is not None else (None if body is None else json.dumps(body))
        return self.http.request(method, self.url + API + path, data=data, headers=headers, params=params,
                                 timeout=10)

    def activate(self, body: Any, **kw: Any) -> list[dict[str, Any]]:
        resp = self.call("POST", "/jobs/activate", body, **kw)
        assert resp.status_code == 200, resp.text
        return resp.json()["jobs"]


@pytest.fixture
def env(serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> Callable[..., tuple[Raw, SandboxAdmin]]:
    def _env(**config: Any) -> tuple[Raw, SandboxAdmin]:
        server = serve("priostack", **config)
        return Raw(server), admin_for(server)

    return _env


def job_of(admin: SandboxAdmin, key: str) -> dict[str, Any]:
    return next(job for job in admin.jobs() if job["key"] == key)


# -- body before key ---------------------------------------------------------------------
@pytest.mark.parametrize("path,raw", [
    ("/jobs/activate", b""),
    ("/jobs/activate", b"{not json"),
    ("/jobs/activate", b"[1, 2]"),
    ("/jobs/somekey/fail", b""),
    ("/jobs/somekey/complete", b"{oops"),
])
def test_invalid_json_answers_400_even_without_a_key(env, path: str, raw: bytes) -> None:
    raw_http, _ = env()
    resp = raw_http.call("POST", path, raw=raw, key=None)
    assert resp.status_code == 400
    assert resp.json() == {"error": "invalid json"}


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_a_valid_body_without_a_good_key_answers_401(env, key: str | None) -> None:
    raw_http, _ = env()
    resp = raw_http.call("POST", "/jobs/activate", {"type": "t", "maxJobsToActivate": 1}, key=key)
    assert resp.status_code == 401
    assert resp.json() == {"error": "unauthorized"}


@pytest.mark.parametrize("how", ["header", "bearer", "query"])
def test_the_key_is_accepted_three_ways(env, how: str) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    jobs = raw_http.activate({"type": "t", "maxJobsToActivate": 1}, how=how)
    assert [job["key"] for job in jobs] == [key]
    assert raw_http.call("POST", f"/jobs/{key}/complete", {}, how=how).status_code == 204


# -- activation ---------------------------------------------------------------------------
def test_activation_filters_by_type_and_without_type_hands_out_every_type(env) -> None:
    raw_http, admin = env()
    a_keys = admin.seed({"jobs": [{"type": "a", "count": 2}]})
    b_keys = admin.seed({"jobs": [{"type": "b"}]})
    c_keys = admin.seed({"jobs": [{"type": "c"}]})

    only_a = raw_http.activate({"type": "a", "maxJobsToActivate": 10})
    assert sorted(j["key"] for j in only_a) == sorted(a_keys)
    assert {j["type"] for j in only_a} == {"a"}

    via_alias = raw_http.activate({"jobType": "b", "maxJobsToActivate": 10})
    assert [j["key"] for j in via_alias] == b_keys

    untyped = raw_http.activate({"maxJobsToActivate": 10})
    assert [j["key"] for j in untyped] == c_keys


def test_max_jobs_to_activate_bounds_the_answer_and_has_no_ceiling(env) -> None:
    raw_http, admin = env()
    admin.seed({"jobs": [{"type": "t", "count": 7}]})
    assert len(raw_http.activate({"type": "t", "maxJobsToActivate": 2})) == 2
    assert raw_http.activate({"type": "t", "maxJobsToActivate": 0}) == []
    assert raw_http.activate({"type": "t"}) == []               # missing: no default, reads as 0
    assert raw_http.activate({"type": "t", "maxJobsToActivate": -3}) == []
    bad = raw_http.call("POST", "/jobs/activate", {"type": "t", "maxJobsToActivate": "3"})
    assert (bad.status_code, bad.json()) == (400, {"error": "invalid json"})
    assert len(raw_http.activate({"type": "t", "maxJobsToActivate": 1_000_000})) == 5


def test_activation_answers_at_once_with_an_empty_list(env) -> None:
    raw_http, _ = env()
    started = time.monotonic()
    body = {"type": "t", "maxJobsToActivate": 5, "requestTimeout": 30_000, "worker": "w", "timeout": 9}
    assert raw_http.activate(body) == []
    assert time.monotonic() - started < 10  # not the 30 s requestTimeout


def test_an_activated_job_leaves_the_queue_and_never_expires(env, sandbox_clock) -> None:
    raw_http, admin = env(deadline_ms=1)
    [key] = admin.seed({"jobs": [{"type": "t", "variables": {"orderId": "ORD-1"}, "retries": 4}]})
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 5})
    assert job["retries"] == 4 and job["variables"] == {"orderId": "ORD-1"}
    sandbox_clock.advance(60)  # well past the informational deadline
    assert raw_http.activate({"type": "t", "maxJobsToActivate": 5}) == []
    assert job_of(admin, key)["state"] == "active"


def test_keys_are_json_strings_unless_the_numeric_quirk_is_on(env) -> None:
    raw_http, admin = env()
    admin.seed({"jobs": [{"type": "t", "count": 2}]})
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    for name in ("key", "processInstanceKey", "processDefinitionKey"):
        assert isinstance(job[name], str)
    assert job["createdAt"] == "0001-01-01T00:00:00Z"
    assert set(job) == {"key", "type", "processInstanceKey", "processDefinitionKey", "variables", "retries",
                        "deadline", "createdAt"}

    admin.configure(numeric_keys=True)
    [numeric] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    for name in ("key", "processInstanceKey", "processDefinitionKey"):
        assert isinstance(numeric[name], int)


def test_activation_only_hands_out_the_callers_own_instances(env) -> None:
    raw_http, admin = env(api_keys=[KEY, "other-key"])
    [theirs] = admin.seed({"jobs": [{"type": "t", "api_key": "other-key"}]})
    assert raw_http.activate({"type": "t", "maxJobsToActivate": 5}) == []
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 5}, key="other-key")
    assert job["key"] == theirs
    assert raw_http.call("POST", f"/jobs/{theirs}/complete", {}).status_code == 404
    assert raw_http.call("GET", f"/process-instances/{job['processInstanceKey']}").status_code == 404


# -- complete and fail ------------------------------------------------------------------------
def test_complete_answers_204_with_an_empty_body_and_merges_variables(env) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t", "variables": {"a": 1, "b": 1}}]})
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    resp = raw_http.call("POST", f"/jobs/{key}/complete", {"variables": {"b": 2, "c": 3}})
    assert resp.status_code == 204 and resp.content == b""
    instance = raw_http.call("GET", f"/process-instances/{job['processInstanceKey']}").json()
    assert instance["state"] == "COMPLETED"
    assert instance["variables"] == {"a": 1, "b": 2, "c": 3}


def test_complete_accepts_an_empty_body(env) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    resp = raw_http.call("POST", f"/jobs/{key}/complete", raw=b"")
    assert resp.status_code == 204 and resp.content == b""


def test_completing_advances_the_instance_to_its_next_task(env) -> None:
    raw_http, admin = env()
    [first] = admin.seed({"jobs": [{"type": "charge", "then": ["ship"], "variables": {"order": 7}}]})
    raw_http.activate({"type": "charge", "maxJobsToActivate": 1})
    raw_http.call("POST", f"/jobs/{first}/complete", {"variables": {"charged": True}})
    [ship] = raw_http.activate({"type": "ship", "maxJobsToActivate": 1})
    assert ship["variables"] == {"order": 7, "charged": True}
    instance = raw_http.call("GET", f"/process-instances/{ship['processInstanceKey']}").json()
    assert instance["state"] == "ACTIVE"
    raw_http.call("POST", f"/jobs/{ship['key']}/complete", {})
    instance = raw_http.call("GET", f"/process-instances/{ship['processInstanceKey']}").json()
    assert instance["state"] == "COMPLETED"


def test_fail_stores_retries_as_sent_and_reactivates_at_once(env) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t", "retries": 3}]})
    raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    resp = raw_http.call("POST", f"/jobs/{key}/fail", {"retries": 7, "errorMessage": "gateway 503"})
    assert resp.status_code == 204 and resp.content == b""
    [again] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert again["key"] == key and again["retries"] == 7  # not decremented, no delay
    described = job_of(admin, key)
    assert described["retries_history"] == [3, 7]
    assert described["error_message"] == "gateway 503"


@pytest.mark.parametrize("body", [
    {"retries": 0, "errorMessage": "boom"},
    {"retries": -2, "errorMessage": "boom"},
    {"errorMessage": "boom"},  # omitted retries counts as 0
])
def test_fail_at_zero_or_without_retries_raises_an_incident(env, body: dict[str, Any]) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert raw_http.call("POST", f"/jobs/{key}/fail", body).status_code == 204
    assert raw_http.activate({"type": "t", "maxJobsToActivate": 1}) == []
    instance = raw_http.call("GET", f"/process-instances/{job['processInstanceKey']}").json()
    assert instance["state"] == "INCIDENT"
    incidents = raw_http.call("GET", "/incidents").json()["items"]
    assert [(i["error_code"], i["processInstanceKey"]) for i in incidents] == \
        [("JOB_FAILED", job["processInstanceKey"])]
    assert job_of(admin, key)["state"] == "incident"


@pytest.mark.parametrize("action,body", [("complete", {}), ("fail", {"retries": 0, "errorMessage": "x"})])
def test_a_repeated_complete_or_fail_answers_404_never_409(env, action: str, body: dict[str, Any]) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert raw_http.call("POST", f"/jobs/{key}/{action}", body).status_code == 204
    again = raw_http.call("POST", f"/jobs/{key}/{action}", body)
    assert again.status_code == 404
    calls = job_of(admin, key)["calls"]
    assert [(c["status"], c["applied"]) for c in calls] == [(204, True), (404, False)]


def test_a_job_that_was_never_activated_cannot_be_completed(env) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    assert raw_http.call("POST", f"/jobs/{key}/complete", {}).status_code == 404
    assert raw_http.call("POST", "/jobs/no-such-job/fail", {"retries": 1}).status_code == 404


@pytest.mark.parametrize("action", ["error", "throw", "retries", "update-retries"])
def test_other_actions_answer_404_unknown_action(env, action: str) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    resp = raw_http.call("POST", f"/jobs/{key}/{action}", {"errorCode": "DECLINED"})
    assert (resp.status_code, resp.json()) == (404, {"error": "unknown action"})
    assert job_of(admin, key)["state"] == "active"


# -- restart, faults, registration ------------------------------------------------------------
def test_admin_restart_returns_stranded_jobs_to_the_queue(env) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t", "retries": 2}]})
    raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert raw_http.activate({"type": "t", "maxJobsToActivate": 1}) == []
    restarted = requests.post(raw_http.url + "/_admin/restart", timeout=10).json()
    assert restarted == {"requeued": [key]}
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert (job["key"], job["retries"]) == (key, 2)
    assert len(job_of(admin, key)["activations"]) == 2


def test_duplicate_delivery_fault_hands_out_an_active_job_again(env) -> None:
    raw_http, admin = env()
    [key] = admin.seed({"jobs": [{"type": "t"}]})
    raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    admin.faults([{"kind": "duplicate_delivery", "endpoint": "activate", "count": 1}])
    [dup] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert dup["key"] == key
    assert raw_http.activate({"type": "t", "maxJobsToActivate": 1}) == []
    assert [a["duplicate"] for a in job_of(admin, key)["activations"]] == [False, True]


def test_worker_registration_is_stored_and_never_consulted(env) -> None:
    raw_http, admin = env()
    reg = raw_http.call("POST", "/workers/register", {"topics": ["t"], "group_name": "g"})
    assert reg.status_code == 201
    worker = reg.json()
    assert set(worker) == {"id", "api_key", "topics", "last_heartbeat", "registered_at", "active",
                           "group_name"}
    beat = raw_http.call("POST", f"/workers/{worker['id']}/heartbeat")
    assert beat.json() == {"status": "ok", "worker_id": worker["id"]}
    assert raw_http.call("POST", "/workers/wkr-unknown/heartbeat").status_code == 404
    listed = raw_http.call("GET", "/workers").json()
    assert listed["total"] == 1 and listed["items"][0]["id"] == worker["id"]
    # Activation does not look at registration: an unregistered topic is still handed out.
    admin.seed({"jobs": [{"type": "not-a-topic"}]})
    assert len(raw_http.activate({"type": "not-a-topic", "maxJobsToActivate": 1})) == 1


def test_a_bad_seed_is_refused(env) -> None:
    raw_http, _ = env()
    resp = requests.post(raw_http.url + "/_admin/jobs", json={"jobs": [{"variables": {}}]}, timeout=10)
    assert resp.status_code == 400


def test_sequential_keys_start_over_when_the_server_is_reset(env) -> None:
    # given a sandbox keyed as a development server: from counters that start with the server
    raw_http, admin = env(sequential_keys=True)
    first = admin.seed({"jobs": [{"type": "t", "count": 3}]})
    [job] = raw_http.activate({"type": "t", "maxJobsToActivate": 1})
    assert raw_http.call("POST", f"/jobs/{job['key']}/complete").status_code == 204

    # when it is re-created (reset) and seeded again
    admin.reset()
    again = admin.seed({"jobs": [{"type": "t", "count": 3}]})

    # then the new jobs carry the keys of the last ones, and the completed key is active work again
    assert again == first and len(set(first)) == 3
    activated = raw_http.activate({"type": "t", "maxJobsToActivate": 3})
    assert [j["key"] for j in activated] == first and job["key"] in first
