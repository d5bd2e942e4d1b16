"""What a local run does, before its first tick, with the deliveries a killed run left in its
state file (local/recovery.py): never claimed, it dispatches them again (the executor, or the
state machine for a long-running one); anything a run may have touched it makes stranded
now, so the first tick's reaper settles it without running the handler. A real SQLite
store; the dispatcher records what it was asked (the executor itself is the CLI tier's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from serverless_worker.local.recovery import recover
from serverless_worker.model import Delivery, LedgerStatus, Outcome, OutcomeKind
from serverless_worker.registry import HandlerRegistry
from serverless_worker.runtime.dispatch import Dispatcher, DispatchError
from serverless_worker.runtime.reaper import reap_action
from serverless_worker.runtime.services import Services
from serverless_worker.settings import Settings
from serverless_worker.state import SqliteStateStore

NOW = 1_900_000_000.0
INSTANCE = "serverless-worker-local"


class RecordingDispatcher(Dispatcher):
    def __init__(self, *, state_machine: bool = True) -> None:
        self.invoked: list[str] = []
        self.executions: list[str] = []
        self._state_machine = state_machine

    def invoke_executor(self, ledger_key: str) -> None:
        self.invoked.append(ledger_key)

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        if not self._state_machine:
            raise DispatchError("no state machine: the local runner found no long-running handler")
        self.executions.append(ledger_key)


def _services(tmp_path: Path, dispatcher: Dispatcher) -> Services:
    settings = Settings(protocol="priostack", base_url="http://127.0.0.1:1", api_key="k", instance_id=INSTANCE)
    store = SqliteStateStore(tmp_path / "state.sqlite3", clock=lambda: NOW)
    return Services(settings=settings, store=store, registry=HandlerRegistry(), dispatcher=dispatcher,
                    clock=lambda: NOW)


def _record(services: Services, n: int, mode: str = "invoke") -> str:
    delivery = Delivery(protocol="priostack", handler="work", job_id=f"job-{n}", ledger_id=f"job-{n}:r3",
                        attempt=1, payload={"n": n}, timeout_seconds=30.0, token=SecretStr("t0ken"), wire={})
    key = services.store.record_delivery(delivery, instance=INSTANCE, deadline=NOW + 420, dispatch_mode=mode)
    assert key is not None
    return key


@pytest.mark.parametrize("state_machine", [True, False], ids=["state-machine", "no-state-machine"])
def test_recovery_runs_what_never_started_and_strands_the_rest(tmp_path: Path, state_machine: bool) -> None:
    # given a state file as a killed run left it: one delivery of each kind
    dispatcher = RecordingDispatcher(state_machine=state_machine)
    services = _services(tmp_path, dispatcher)
    store = services.store
    recorded = _record(services, 1)
    long_recorded = _record(services, 2, mode="state_machine")
    running = _record(services, 3)
    assert store.start_run(running, epoch="dead-executor", deadline=NOW + 900) is not None
    stored = _record(services, 4)
    assert store.start_run(stored, epoch="dead-executor-2", deadline=NOW + 900) is not None
    store.store_outcome(stored, "dead-executor-2", Outcome(kind=OutcomeKind.SUCCESS, result={"n": 4}))
    settled = _record(services, 5)
    assert store.mark_discarded(settled, "duplicate")

    # when the next run recovers before its first tick
    report = recover(services)

    # then what never started is dispatched again as it was dispatched before (a long-running
    # one without a state machine this run is left to the reaper, which hands it back)
    assert dispatcher.invoked == [recorded]
    assert dispatcher.executions == ([long_recorded] if state_machine else [])
    to_reap = {running, stored} | (set() if state_machine else {long_recorded})
    assert (report.dispatched, report.stranded) == (1 + state_machine, len(to_reap))
    assert (report.vanished, report.unstarted) == (1, 0 if state_machine else 1)
    # and everything a run may have touched is stranded now, for the reaper to settle unrun
    stranded = {item.key: item for item in store.stranded("priostack", INSTANCE, NOW)}
    assert set(stranded) == to_reap
    assert reap_action(stranded[running]) == "time_out"
    assert reap_action(stranded[stored]) == "resettle"
    if not state_machine:
        assert reap_action(stranded[long_recorded]) == "hand_back"
    # and a settled delivery is left alone
    item = store.get(settled)
    assert item is not None and item.status is LedgerStatus.DISCARDED


def test_a_clean_state_file_recovers_nothing(tmp_path: Path) -> None:
    dispatcher = RecordingDispatcher()
    report = recover(_services(tmp_path, dispatcher))
    assert report.total == 0 and not dispatcher.invoked and not dispatcher.executions


def test_the_recovery_note_says_what_became_of_each_and_what_was_lost() -> None:
    from serverless_worker.local.recovery import RecoveryReport, recovery_note

    nothing_lost = recovery_note(RecoveryReport(dispatched=2, stranded=1))
    assert nothing_lost == ("recovered 3 deliveries an earlier run left in flight: 2 never started (run now); "
                            "1 already ran (their stored outcome is reported, not run again); nothing was lost")
    # a long-running delivery that never started, with no state machine this run, is handed back
    handed_back = recovery_note(RecoveryReport(dispatched=1, stranded=2, unstarted=1))
    assert handed_back == ("recovered 3 deliveries an earlier run left in flight: 1 never started (run now); "
                           "1 never started and not run this time (handed back to the server unstarted); 1 already "
                           "ran (their stored outcome is reported, not run again); nothing was lost"), handed_back
    killed = recovery_note(RecoveryReport(stranded=1, vanished=1))
    assert killed.endswith("1 running when it was killed (reported as timed out, so the server may retry them); "
                           "only the unstored work of the 1 killed run is lost"), killed
