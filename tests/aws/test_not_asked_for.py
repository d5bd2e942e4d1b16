"""Only what was asked for runs: a server that answers a pull with work of another type or
handler, outside the claim's criteria, or beyond the count asked for gets each such
delivery back untouched (runtime/pulling.py), through moto running the real functions.

Checked on the sandbox's own record: no handler ran for it, no attempt was used (Priostack
``retries`` as seeded, no incident; Pipelogiq requeued, never leased, no result; the claim
queue's item given no result, its lease left to lapse back to pending), and the worker's
own jobs ran. The sandboxes bend the rule with the ``foreign_delivery`` fault and
Priostack's ``overdeliver`` quirk.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, done, results, wait_for

from serverless_worker.runtime.metrics import metrics
from serverless_worker.sandbox.admin import job_id

pytestmark = pytest.mark.aws

OURS, FOREIGN = "e2e.echo", "e2e.foreign"
_PULL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
CRITERIA = {"format": "jpg"}


def _seed_mixed(env: Any) -> None:
    """Two jobs of ours, one that is not: another handler's (Pipelogiq, Priostack) or, on the
    claim queue, an item of our queue that fails our criteria (seeded first: the oldest)."""
    if env.protocol == "claimqueue":
        env.admin.seed({"queue": OURS, "items": [{"format": "png", "n": 9}, {"format": "jpg", "n": 0},
                                                 {"format": "jpg", "n": 1}]})
        return
    env.seed(FOREIGN, [{"n": 9}], retries=3)
    env.seed(OURS, [{"n": 0}, {"n": 1}], retries=3)


def _foreign(env: Any) -> dict[str, Any]:
    (job,) = [job for job in env.admin.jobs() if _is_foreign(env.protocol, job)]
    return job


def _is_foreign(protocol: str, job: dict[str, Any]) -> bool:
    if protocol == "pipelogiq":
        return bool(job["handler"] == FOREIGN)
    if protocol == "priostack":
        return bool(job["type"] == FOREIGN)
    return bool(job["item"].get("format") == "png")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_delivery_not_asked_for_is_given_back_untouched(worker_env: Any, protocol: str) -> None:
    # given a server that, once, answers a pull with work this worker did not ask for
    env = worker_env(protocol, handlers=[OURS], handler_module=HANDLERS_PATH,
                     sandbox={"lease_seconds": 4} if protocol == "claimqueue" else None,
                     settings={"criteria": {OURS: CRITERIA}} if protocol == "claimqueue" else None)
    _seed_mixed(env)
    env.admin.faults([{"kind": "foreign_delivery", "endpoint": _PULL[protocol], "count": 1}])
    counted = metrics.totals["DeliveriesNotAskedFor"]

    # when a tick pulls (and its executors run what it recorded)
    report = env.tick(2.0)
    env.stack.wait_idle(20)

    # then the foreign delivery was given back, counted and named, and never recorded
    assert env.admin.stats()["faults_fired"] == 1, report
    (unasked,) = report["not_asked_for"]
    foreign = _foreign(env)
    assert unasked["job_id"] == job_id(protocol, foreign) and unasked["given_back"], unasked
    assert unasked["kind"] == ("criteria" if protocol == "claimqueue" else "type"), unasked
    assert ("png" if protocol == "claimqueue" else FOREIGN) in unasked["why"], unasked
    assert metrics.totals["DeliveriesNotAskedFor"] == counted + 1
    # and on the server it is untouched: no result, no attempt used, no incident
    if protocol == "priostack":  # its one call: failed back with retries as they were
        assert [call["body"]["retries"] for call in results(protocol, foreign)] == [3], foreign
        assert (foreign["state"], foreign["retries"], foreign["incident"]) == ("waiting", 3, None), foreign
    elif protocol == "pipelogiq":
        assert results(protocol, foreign) == [], foreign
        assert foreign["status"] == "Pending" and foreign["failures"] == 0, foreign
        assert [e["event"] for e in foreign["history"]][-2:] == ["delivered", "requeue"], foreign["history"]
        assert not any(e["lease"] for e in foreign["executions"]), foreign
    else:
        assert results(protocol, foreign) == [], foreign
        wait_for(lambda: _foreign(env)["status"] == "pending", 10, "the foreign item's lease to lapse")
        events = [e["event"] for e in _foreign(env)["history"]]
        assert events.count("claim") == 1 and "result" not in events, events
    # and the worker's own jobs ran, each once
    ours = [job for job in env.admin.jobs() if not _is_foreign(protocol, job)]
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs() if not _is_foreign(protocol, job)),
             20, "the worker's own jobs done")
    assert len(ours) == 2


def test_priostack_jobs_beyond_the_count_asked_for_go_back_with_their_retries(worker_env: Any) -> None:
    # given a Priostack server that hands out two jobs more than maxJobsToActivate
    env = worker_env("priostack", handlers=[OURS], handler_module=HANDLERS_PATH, sandbox={"overdeliver": 2},
                     settings={"batch_size": 2, "max_in_flight": 2, "executor_reserved_concurrency": 2})
    env.seed(OURS, [{"n": n} for n in range(4)], retries=5)

    # when a tick pulls at most two at a time
    report = env.tick(3.0)
    env.stack.wait_idle(20)

    # then the first activation's surplus went back, counted as beyond the count
    assert [u["kind"] for u in report["not_asked_for"]][:2] == ["count", "count"], report
    assert all("beyond the 2 asked for" in u["why"] and u["given_back"] for u in report["not_asked_for"]), report
    # and every job ran once, none used an attempt on the way: each surplus job was failed
    # back with retries 5, and completed when activated again
    wait_for(lambda: all(done("priostack", job) for job in env.admin.jobs()), 30, "all four jobs completed")
    jobs = env.admin.jobs()
    assert all(job["incident"] is None and set(job["retries_history"]) <= {5} for job in jobs), jobs
    fails = [call["body"] for job in jobs for call in job["calls"] if call["action"] == "fail"]
    assert fails == [{"retries": 5, "errorMessage": "handed back without running"}] * len(report["not_asked_for"])
    assert sorted(len([c for c in job["calls"] if c["action"] == "complete"]) for job in jobs) == [1] * 4
