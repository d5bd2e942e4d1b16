"""CLI tier: ``serverless-worker local`` killed with SIGKILL mid-run, then started again on
the same state file, settles every job exactly once (docs/ledger.md, "The local worker").

The first run works a sandbox this test starts until its ledger holds deliveries in each
state a crash can leave: settled (reported and acknowledged), outcome stored but never
reported (the server answers every result with 503 meanwhile), and running (a handler
that holds until the test lets it go). Then SIGKILL: no drain, no cleanup. The second run,
same command, same ``--state`` file, ``--until-idle``, must give every job exactly one
outcome on the server, and must not run again any handler whose outcome was stored (and so
could have been reported). The handler module writes one marker file per run, which is
how runs are counted across the two processes. The same for a long-running job killed
mid-slice (its execution dies with moto, in the process), and for a run that drained: the
next run on its file pulls again and counts only its own jobs.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import CLI, SANDBOX_KEYS, SECRET, clean_env, settled

from serverless_worker.model import LedgerStatus
from serverless_worker.sandbox import create_sandbox
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.state import LedgerItem
from support.waiting import wait_for

pytestmark = pytest.mark.cli

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")

HANDLERS = '''
import os
import pathlib
import uuid

from serverless_worker import handler

MARKS = pathlib.Path(os.environ["CRASH_MARKS"])


@handler("crash.work")
def work(job):
    n = job.input["n"]
    (MARKS / f"{n}.{os.getpid()}.{uuid.uuid4().hex[:8]}.run").touch()  # one file per run
    while job.input.get("hold") and (MARKS / "hold").exists():
        if job.wait(0.05):
            job.raise_if_cancelled()
    return {"n": n}
'''

# The endpoint each protocol's result goes to (the sandbox's fault label).
RESULT_ENDPOINT = {"pipelogiq": "result", "priostack": "complete", "claimqueue": "result"}
# Sandbox settings. The claim queue's lease cannot be renewed, so the held runs' leases
# must lapse for their items to come back: short, yet longer than a restart and the
# re-reports that follow it.
SANDBOX = {"pipelogiq": {}, "priostack": {}, "claimqueue": {"lease_seconds": 12}}
# Idle before the second run drains: the claim queue's held items come back only when their
# leases lapse.
UNTIL_IDLE = {"pipelogiq": "3", "priostack": "3", "claimqueue": "15"}
SETTLED_BEFORE = (0, 1)     # reported and acknowledged before the kill
STORED = (2, 3)             # ran, outcome stored, every report refused until the kill
HELD = (4, 5)               # running at the kill


@pytest.fixture
def served(protocol: str) -> Iterator[tuple[SandboxServer, SandboxAdmin]]:
    """The protocol's sandbox, accepting only SECRET, in this process; it outlives both runs."""
    server = SandboxServer(create_sandbox(protocol, **SANDBOX_KEYS[protocol], **SANDBOX[protocol])).start()
    admin = SandboxAdmin(server.url)
    try:
        yield server, admin
    finally:
        admin.close()
        server.stop()


def _seed(admin: Any, protocol: str, inputs: list[dict[str, Any]]) -> None:
    if protocol == "pipelogiq":
        admin.seed({"handler": "crash.work", "inputs": inputs})  # maxRetries 0: a timeout is final
    elif protocol == "priostack":
        admin.seed({"jobs": [{"type": "crash.work", "variables": v, "retries": 1} for v in inputs]})
    else:
        admin.seed({"queue": "crash.work", "items": inputs})


def _input(protocol: str, job: dict[str, Any]) -> dict[str, Any]:
    if protocol == "pipelogiq":
        return dict(json.loads(job["input"]))
    if protocol == "priostack":
        return dict(job["variables"])
    return dict(job["item"])


def _results(protocol: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """The outcomes the server applied for the job (a claim queue's accepted results)."""
    if protocol == "pipelogiq":
        return [h for h in job["history"] if h["event"] == "result_received"]
    if protocol == "priostack":
        return [c for c in job["calls"] if c.get("applied")]
    return [h for h in job["history"] if h["event"] == "result"]


def _ledger(state: Path) -> dict[int, list[LedgerItem]]:
    """The state file's deliveries by the job's ``n``, read-only (the worker may be writing)."""
    try:
        db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=5)
        try:
            rows = db.execute("SELECT doc FROM items WHERE pk LIKE 'delivery#%'").fetchall()
        finally:
            db.close()
    except sqlite3.Error:
        return {}  # not created yet
    by_n: dict[int, list[LedgerItem]] = {}
    for (doc,) in rows:
        item = LedgerItem.from_attributes(json.loads(doc))
        payload = item.delivery.payload  # Pipelogiq's input is a JSON string
        by_n.setdefault(int((json.loads(payload) if isinstance(payload, str) else payload)["n"]), []).append(item)
    return by_n


def _statuses(state: Path) -> dict[int, set[LedgerStatus]]:
    return {n: {item.status for item in items} for n, items in _ledger(state).items()}


def _runs(marks: Path) -> Counter[int]:
    return Counter(int(path.name.split(".")[0]) for path in marks.glob("*.run"))


@contextmanager
def killed_when_done(command: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """The first run: started, left to reach the state the body waits for, then killed
    outright (SIGKILL: no drain, nothing settled on the way out)."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        yield process
        assert process.poll() is None, process.communicate()[0]
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_killed_worker_restarted_on_its_state_file_settles_every_job_once(
        protocol: str, served: tuple[SandboxServer, SandboxAdmin], tmp_path: Path) -> None:
    server, admin = served
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "hold").touch()
    module = tmp_path / "crash_handlers.py"
    module.write_text(HANDLERS)
    state = tmp_path / "state" / "worker.sqlite3"
    command = [str(CLI), "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
               "--handler-module", str(module), "--concurrency", "4", "--state", str(state)]
    env = clean_env(TEST_KEY=SECRET, CRASH_MARKS=str(marks))
    with killed_when_done(command, tmp_path, env) as first:
        # given two jobs settled by the first run
        _seed(admin, protocol, [{"n": n} for n in SETTLED_BEFORE])
        wait_for(lambda: first.poll() is not None or (
            sum(1 for job in admin.jobs() if _results(protocol, job)) == 2
            and all(_statuses(state).get(n) == {LedgerStatus.ACKNOWLEDGED} for n in SETTLED_BEFORE)),
            60, "the first two jobs settled")
        # and two whose outcome is stored but never reported, and two still running
        admin.faults([{"kind": "error_5xx", "endpoint": RESULT_ENDPOINT[protocol]}])
        _seed(admin, protocol, [{"n": n} for n in STORED] + [{"n": n, "hold": True} for n in HELD])
        expected = {**{n: {LedgerStatus.OUTCOME_STORED} for n in STORED},
                    **{n: {LedgerStatus.RUNNING} for n in HELD}}
        # (the ledger says RUNNING from the claim on, before the lease and the handler: the
        # markers say the handlers did start)
        wait_for(lambda: first.poll() is not None or (
            all(_statuses(state).get(n) == want for n, want in expected.items())
            and all(_runs(marks)[n] == 1 for n in HELD)
            and admin.stats()["calls"].get(RESULT_ENDPOINT[protocol], 0) >= 2 + len(STORED)),
            60, "stored outcomes refused by the server and held runs")
        # when the worker is killed: no drain, nothing settled on the way out
    at_kill = _statuses(state)
    assert all(not _results(protocol, job) for job in admin.jobs() if _input(protocol, job)["n"] not in
               SETTLED_BEFORE), "a refused report reached the server"
    assert _runs(marks) == Counter({n: 1 for n in (*SETTLED_BEFORE, *STORED, *HELD)})

    # and started again, same command, same state file, once the server takes results again
    admin.clear_faults()
    (marks / "hold").unlink()
    second = subprocess.run([*command, "--until-idle", UNTIL_IDLE[protocol]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)

    # then it found what the first run left and exits 0 with nothing in flight
    out = second.stdout
    assert second.returncode == 0, f"stdout:\n{out}\nstderr:\n{second.stderr}"
    # (saying what each kind became, and what was lost: the work of the two killed runs only)
    assert ("recovered 4 deliveries an earlier run left in flight: 2 already ran (their stored outcome is "
            "reported, not run again); 2 running when it was killed (reported as timed out, so the server may "
            "retry them); only the unstored work of the 2 killed runs is lost") in " ".join(out.split()), out
    assert not [item for items in _ledger(state).values() for item in items if not item.is_final]
    # and every job has exactly one outcome on the server, in a final state
    jobs = {_input(protocol, job)["n"]: job for job in admin.jobs()}
    assert sorted(jobs) == [0, 1, 2, 3, 4, 5]
    for n, job in jobs.items():
        assert settled(protocol, job), (n, job)
        assert len(_results(protocol, job)) == 1, (n, job)
    # and no handler whose outcome was stored ran again: the stored outcome was reported
    runs = _runs(marks)
    for n in (*SETTLED_BEFORE, *STORED):
        assert at_kill[n] in ({LedgerStatus.ACKNOWLEDGED}, {LedgerStatus.OUTCOME_STORED})
        assert runs[n] == 1, (n, runs)
        _check_success(protocol, jobs[n], n)
    # and a run that vanished mid-handler (its outcome never stored) was settled as the protocol allows
    for n in HELD:
        _check_vanished(protocol, jobs[n], runs[n], {"n": n})


def _check_success(protocol: str, job: dict[str, Any], n: int) -> None:
    (result,) = _results(protocol, job)
    if protocol == "pipelogiq":
        assert result["isSuccess"] is True and job["status"] == "Completed", job
    elif protocol == "priostack":
        assert result["action"] == "complete" and job["state"] == "completed", job
    else:
        assert job["status"] == "finished" and job["result"] == {"n": n}, job


def _check_vanished(protocol: str, job: dict[str, Any], runs: int, rerun_result: dict[str, Any]) -> None:
    (result,) = _results(protocol, job)
    if protocol == "pipelogiq":
        # A timeout for the lost run; maxRetries 0 makes it final, so it never ran again.
        assert (result["isSuccess"], result["errorCode"]) == (False, "HANDLER_TIMEOUT"), job
        assert job["status"] == "Failed" and runs == 1, (job, runs)
    elif protocol == "priostack":
        # fail with retries 1 - 1 = 0: an incident, never run again.
        assert (result["action"], result["body"]["retries"]) == ("fail", 0), job
        assert job["state"] == "incident" and runs == 1, (job, runs)
    else:
        # Nothing to send for a lost claim-queue run: its lease lapsed, the item was claimed
        # again and ran to its one result.
        events = [h["event"] for h in job["history"]]
        assert events == ["created", "claim", "lapse", "claim", "result"], events
        assert job["result"] == rerun_result and runs == 2, (job, runs)


@pytest.mark.parametrize("protocol", ["priostack"])
def test_a_drained_runs_file_lets_the_next_run_work_and_count_only_its_own(
        protocol: str, served: tuple[SandboxServer, SandboxAdmin], tmp_path: Path) -> None:
    """A run that drained (idle, Ctrl-C) leaves its draining flag and its settled deliveries
    in the file: the next run must pull anyway, and its summary counts only what it took."""
    from test_local_cli import row

    server, admin = served
    marks = tmp_path / "marks"
    marks.mkdir()
    module = tmp_path / "crash_handlers.py"
    module.write_text(HANDLERS)
    command = [str(CLI), "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
               "--handler-module", str(module), "--state", str(tmp_path / "kept.sqlite3"), "--until-idle", "2"]
    env = clean_env(TEST_KEY=SECRET, CRASH_MARKS=str(marks))
    for batch in ((0, 1, 2), (3, 4, 5)):
        # given jobs for this run, and the file the run before it drained from
        _seed(admin, protocol, [{"n": n} for n in batch])
        # when the worker runs until idle on the same file
        result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        # then it took and settled this run's jobs, and counted only those
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        assert row(result.stdout, "taken") == 3 and row(result.stdout, "done") == 3, result.stdout
    assert all(settled(protocol, job) for job in admin.jobs())
    assert _runs(marks) == Counter({n: 1 for n in range(6)})


LONG_HANDLERS = HANDLERS + '''

from serverless_worker import Continue


@handler("crash.long", mode="slices")
def long(job):
    n = job.input["n"]
    (MARKS / f"{n}.{os.getpid()}.{uuid.uuid4().hex[:8]}.run").touch()  # one file per slice run
    while job.input.get("hold") and (MARKS / "hold").exists():
        if job.wait(0.05):
            job.raise_if_cancelled()
    done = (job.checkpoint or 0) + 1
    return Continue(done) if done < 2 else {"n": n, "slices": done}
'''


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_long_running_job_killed_mid_slice_is_settled_once_by_the_next_run(
        protocol: str, served: tuple[SandboxServer, SandboxAdmin], tmp_path: Path) -> None:
    """The long path: the slice runs under a state-machine execution in moto, which dies
    with the process. The next run (a fresh moto) finds the delivery running under that
    execution's epoch and settles it as a lost run, as the reaper does on AWS."""
    server, admin = served
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "hold").touch()
    module = tmp_path / "long_handlers.py"
    module.write_text(LONG_HANDLERS)
    state = tmp_path / "long.sqlite3"
    command = [str(CLI), "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
               "--handler-module", str(module), "--handlers", "crash.long", "--state", str(state)]
    env = clean_env(TEST_KEY=SECRET, CRASH_MARKS=str(marks))
    if protocol == "priostack":
        admin.seed({"jobs": [{"type": "crash.long", "variables": {"n": 7, "hold": True}, "retries": 1}]})
    elif protocol == "pipelogiq":
        admin.seed({"handler": "crash.long", "inputs": [{"n": 7, "hold": True}]})
    else:
        admin.seed({"queue": "crash.long", "items": [{"n": 7, "hold": True}]})
    with killed_when_done(command, tmp_path, env) as first:
        # given the long job's first slice running under the state machine
        wait_for(lambda: first.poll() is not None or (
            _statuses(state).get(7) == {LedgerStatus.RUNNING} and _runs(marks)[7] == 1), 90, "the slice to run")
        # when the worker is killed, and started again on its state file
    (item,) = _ledger(state)[7]
    assert item.dispatch_mode == "state_machine" and item.status is LedgerStatus.RUNNING
    (marks / "hold").unlink()
    second = subprocess.run([*command, "--until-idle", UNTIL_IDLE[protocol]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)

    # then the job has exactly one outcome, and nothing is left in flight
    assert second.returncode == 0, f"stdout:\n{second.stdout}\nstderr:\n{second.stderr}"
    assert "recovered 1 deliveries" in second.stdout
    assert not [i for items in _ledger(state).values() for i in items if not i.is_final]
    (job,) = admin.jobs()
    assert settled(protocol, job) and len(_results(protocol, job)) == 1, job
    # (a claim queue's re-claimed run does both slices: runs counts the first slice once)
    _check_vanished(protocol, job, _runs(marks)[7] - (protocol == "claimqueue"), {"n": 7, "slices": 2})
