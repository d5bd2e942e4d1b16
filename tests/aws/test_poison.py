"""One job, one fate, on the Lambda path: the scheduler function (in moto, its ledger in
DynamoDB) settles a delivery the ledger cannot hold on its own, and dispatches the jobs
pulled with it, which the executors complete."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import done, jobs_by_id, ledger, wait_for
from handlers_lease import LEASE_HANDLERS_PATH

from serverless_worker.model import LedgerStatus
from support.poison import incompressible, nested

pytestmark = pytest.mark.aws




def validation_error(protocol: str, job: dict[str, Any]) -> str:
    """The poisoned job's definite outcome on the server, as its error text ('' when none yet)."""
    if protocol == "priostack":
        return str(job["error_message"]) if job["state"] == "incident" and job["retries"] == 0 else ""
    if protocol == "pipelogiq":
        results = [h for h in job["history"] if h["event"] == "result_received"]
        return str(results) if job["status"] == "Failed" and job["errorCode"] == "VALIDATION_ERROR" else ""
    result = job.get("result") or {}
    return str(result.get("error", "")) if result.get("errorCode") == "VALIDATION_ERROR" else ""


CASES = [("priostack", "nested"), ("priostack", "huge"), ("claimqueue", "nested"), ("pipelogiq", "huge")]


@pytest.mark.parametrize(("protocol", "poison"), CASES, ids=[f"{p}-{k}" for p, k in CASES])
def test_a_poisoned_job_fails_with_its_reason_and_the_rest_of_its_batch_is_done(
        worker_env: Any, protocol: str, poison: str) -> None:
    # given five jobs, the middle one nested 300 deep or carrying 1 MiB (past the item limit deflated)
    env = worker_env(protocol, handlers=["echo"])
    content = {"deep": nested(300)} if poison == "nested" else {"blob": incompressible(1 << 20)}
    env.seed("echo", [{"n": 0}, {"n": 1}, content, {"n": 3}, {"n": 4}])
    ids = list(jobs_by_id(env))

    # when one scheduler tick pulls them
    report = env.tick(2.0)

    # then the tick succeeded (no function error), dispatched the four others, settled the fifth
    assert report["pulled"] == 5 and report["dispatched"] == 4 and not report["errors"], report
    assert report["unrecordable"] == 1 and report["unsettled"] == [], report
    env.stack.wait_idle()
    good = [job_id for job_id in ids if job_id != ids[2]]
    wait_for(lambda: all(done(protocol, jobs_by_id(env)[job_id]) for job_id in good), what="4 good jobs done")
    text = wait_for(lambda: validation_error(protocol, jobs_by_id(env)[ids[2]]), what="the poisoned job failed")
    assert "cannot record this job" in text
    assert ("nests too deep" if poison == "nested" else "item limit") in text, text
    # and the ledger holds the four, settled; nothing of the poisoned one
    wait_for(lambda: len(ledger(env)) == 4 and all(i.status == LedgerStatus.ACKNOWLEDGED for i in ledger(env)),
             what="4 ledger items settled")
    assert ids[2] not in {item.delivery.job_id for item in ledger(env)}


def test_a_job_key_no_request_can_name_is_reported_unsettled_by_the_tick(worker_env: Any) -> None:
    env = worker_env("priostack", handlers=["echo"])
    env.admin.seed({"jobs": [{"type": "echo", "variables": {"n": n}, "retries": 3} for n in range(2)]
                    + [{"type": "echo", "key": "\ud800", "retries": 3}]
                    + [{"type": "echo", "variables": {"n": n}, "retries": 3} for n in range(3, 5)]})

    report = env.tick(2.0)

    assert report["pulled"] == 5 and report["dispatched"] == 4 and not report["errors"], report
    assert report["unrecordable"] == 1 and len(report["unsettled"]) == 1, report
    assert "not valid Unicode" in report["unsettled"][0]
    env.stack.wait_idle()
    wait_for(lambda: sorted(job["state"] for job in env.admin.jobs()) == ["active"] + ["completed"] * 4,
             what="the four others completed")


# A handler declaring a timeout the live lease fits, on the short path and in slices (the
# state machine's acquire step).
LEASE_CASES = [("claimqueue", "lease.timed"), ("pipelogiq", "lease.timed"), ("pipelogiq", "lease.sliced")]


@pytest.mark.parametrize(("protocol", "name"), LEASE_CASES, ids=["claimqueue", "pipelogiq", "pipelogiq-slices"])
def test_a_lease_granted_already_past_never_runs_the_handler_nor_stops_the_worker(
        worker_env: Any, protocol: str, name: str) -> None:
    # given three jobs, the first lease granted already past (claim queue lease.until,
    # Pipelogiq leaseExpiresAt), and a handler that declares a timeout the lease would fit
    env = worker_env(protocol, handlers=[name], handler_module=LEASE_HANDLERS_PATH)
    env.seed(name, [{"n": n} for n in range(3)])
    label = "claim" if protocol == "claimqueue" else "lease.acquire"
    env.admin.faults([{"kind": "expired_lease", "endpoint": label, "count": 1}])

    # when ticks run until every job is done (the lapsed one comes back with a live lease)
    for _ in range(10):
        env.tick(2.0)
        env.stack.wait_idle()
        if all(done(protocol, job) for job in env.admin.jobs()):
            break

    # then every job is done, one delivery was discarded unrun, and the worker was never stopped
    assert all(done(protocol, job) for job in env.admin.jobs()), env.admin.jobs()
    assert env.admin.stats()["faults_fired"] == 1
    wait_for(lambda: all(item.status.is_final for item in ledger(env)), what="every ledger item settled")
    items = ledger(env)
    discarded = [item for item in items if item.status == LedgerStatus.DISCARDED]
    assert len(discarded) == 1 and "lease granted already expired" in (discarded[0].error or ""), items
    assert all(item.status == LedgerStatus.ACKNOWLEDGED for item in items if item not in discarded), items
    control = env.stack.store().get_control(protocol, env.stack.services().instance)
    assert not control.get("unfit") and not control.get("stopped"), control
