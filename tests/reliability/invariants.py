"""The invariants every fault scenario ends on, read from the sandbox's own history.

A scenario drives the worker through some fault, then calls ``observe`` (what the
server and the ledger say happened), ``check`` (the reliability invariants: one final
outcome per job, nothing stranded or lost, the handler run at most once per job unless
the protocol makes a re-run unavoidable, nothing left in flight) and ``record_row``
(one line of the scenario x protocol table, ``scripts/fault_matrix_table.py``).

The sandboxes describe jobs each their own way; the per-protocol readers here turn that
into the few facts the invariants are about, so the three fault-matrix files share one
definition of "final", "applied result" and "stranded".
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from aws.e2e_support import in_flight, job_id, ledger
from serverless_worker.model import LedgerStatus
from serverless_worker.sandbox.admin import server_state

__all__ = [
    "FINAL_STATES",
    "Observed",
    "check",
    "matrix_path",
    "observe",
    "record_na",
    "record_row",
]

# Server-side states a job never leaves (claim queue "error": finished with an in-band
# error record; "failed" there is the queue's own timeout).
FINAL_STATES: dict[str, frozenset[str]] = {
    "pipelogiq": frozenset({"completed", "failed"}),
    "priostack": frozenset({"completed", "incident"}),
    "claimqueue": frozenset({"finished", "error", "failed"}),
}
_SETTLES = ("ack", "requeue", "visibility_requeue")  # Pipelogiq events that end a delivery token
_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Observed:
    """What one scenario left behind, on both sides."""

    protocol: str
    jobs: int                        # jobs the sandbox holds (env.admin.jobs())
    final: Counter[str]              # server-side final state per job -> job count
    results: Counter[int]            # applied results per job -> job count
    runs: dict[str, int]             # handler runs per job id (from the test's run counter)
    reruns: dict[str, int]           # job id -> runs, for jobs whose handler ran more than once
    not_final: list[str]             # job ids not in a final state (stranded / lost)
    ledger: Counter[str]             # ledger status -> items
    in_flight: int                   # the in-flight index count
    duplicates_discarded: int        # ledger items DISCARDED (duplicate, stale or refused deliveries)
    faults_fired: Counter[str]       # "kind@endpoint" -> times, from the sandbox's fault log
    # -- additions (after the agreed fields, all defaulted) --------------------------
    states: dict[str, str] = field(default_factory=dict)        # job id -> final state
    unsettled: list[str] = field(default_factory=list)          # Pipelogiq: a delivery token never settled
    duplicates_delivered: int = 0    # deliveries the sandbox handed out again while the first was out
    problems: dict[str, str] = field(default_factory=dict)      # job id -> applied-result violation
    unknown_runs: list[str] = field(default_factory=list)       # handler ran for ids the server never had
    jobs_raw: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    def facts(self) -> str:
        """The scenario facts an assertion message quotes."""
        return (f"[{self.protocol}] jobs={self.jobs} final={dict(self.final)} ledger={dict(self.ledger)} "
                f"in_flight={self.in_flight} faults_fired={dict(self.faults_fired)} "
                f"duplicates delivered/discarded={self.duplicates_delivered}/{self.duplicates_discarded}")


# -- reading the sandbox ------------------------------------------------------------------


def _applied(protocol: str, job: dict[str, Any]) -> int:
    """Results the server applied to the job (Pipelogiq: over all its executions)."""
    if protocol == "pipelogiq":
        return sum(h["event"] == "result_applied" for h in job["history"])
    if protocol == "priostack":
        return sum(bool(c.get("applied")) for c in job["calls"])
    return sum(h["event"] == "result" and bool(h.get("accepted")) for h in job["history"])


def _result_problem(protocol: str, job: dict[str, Any], state: str) -> str | None:
    """Why the job's applied results break "one outcome ended it", or None."""
    if protocol == "pipelogiq":
        per_execution = Counter(h["executionId"] for h in job["history"] if h["event"] == "result_applied")
        twice = [e for e, n in per_execution.items() if n > 1]
        if twice:
            return f"executions {twice} had more than one applied result"
        if state in FINAL_STATES[protocol] and state == "completed" and not per_execution:
            return "completed without an applied result"
        return None
    if protocol == "priostack":
        applied = [c for c in job["calls"] if c.get("applied")]
        ending = [c for c in applied if c["action"] == "complete"
                  or not ((c.get("body") or {}).get("retries") or 0) > 0]
        if state in FINAL_STATES[protocol] and len(ending) != 1:
            return f"{len(ending)} applied complete/fail calls ended it (want 1): {[c['action'] for c in ending]}"
        if state not in FINAL_STATES[protocol] and ending:
            return "an ending complete/fail applied but the job is not final"
        return None
    accepted = _applied(protocol, job)
    if state in ("finished", "error") and accepted != 1:
        return f"{accepted} accepted results (want 1)"
    return None


def _unsettled(job: dict[str, Any]) -> bool:
    """Pipelogiq: a delivery token was handed out and neither acked nor requeued."""
    out: set[str] = set()
    for h in job["history"]:
        if h["event"] == "delivered":
            out.add(h["tokenFingerprint"])
        elif h["event"] in _SETTLES:
            out.discard(h.get("tokenFingerprint", ""))
    return bool(out)


def _duplicates_delivered(protocol: str, job: dict[str, Any]) -> int:
    if protocol == "pipelogiq":
        executions = Counter(h["executionId"] for h in job["history"] if h["event"] == "delivered")
        requeues = Counter(h["executionId"] for h in job["history"] if h["event"] in ("requeue", "visibility_requeue"))
        return sum(max(0, n - 1 - requeues[e]) for e, n in executions.items())
    if protocol == "priostack":
        return sum(bool(a["duplicate"]) for a in job["activations"])
    return sum(h["event"] == "duplicate_delivery" for h in job["history"])


def _faults_fired(env: Any) -> Counter[str]:
    answer = requests.get(f"{env.admin.base_url}/_admin/faults", timeout=10)
    answer.raise_for_status()
    return Counter(f"{f['kind']}@{f['endpoint']}" for f in answer.json()["fired"])


def observe(env: Any, runs: Mapping[str, int]) -> Observed:
    """Read the sandbox's own history (admin jobs/stats/fault log) and the ledger."""
    protocol = env.protocol
    jobs = {job_id(protocol, job): job for job in env.admin.jobs()}
    states = {jid: server_state(protocol, job) for jid, job in jobs.items()}
    unsettled = sorted(jid for jid, job in jobs.items() if protocol == "pipelogiq" and _unsettled(job))
    not_final = sorted({jid for jid, state in states.items() if state not in FINAL_STATES[protocol]}
                       | set(unsettled))
    problems = {jid: p for jid, job in jobs.items() if (p := _result_problem(protocol, job, states[jid]))}
    items = ledger(env)
    run_counts = {jid: int(n) for jid, n in runs.items() if n}
    return Observed(
        protocol=protocol,
        jobs=len(jobs),
        final=Counter(states.values()),
        results=Counter(_applied(protocol, job) for job in jobs.values()),
        runs=run_counts,
        reruns={jid: n for jid, n in run_counts.items() if n > 1},
        not_final=not_final,
        ledger=Counter(str(item.status) for item in items),
        in_flight=in_flight(env),
        duplicates_discarded=sum(item.status is LedgerStatus.DISCARDED for item in items),
        faults_fired=_faults_fired(env),
        states=states,
        unsettled=unsettled,
        duplicates_delivered=sum(_duplicates_delivered(protocol, job) for job in jobs.values()),
        problems=problems,
        unknown_runs=sorted(set(run_counts) - set(jobs)),
        jobs_raw=jobs,
    )


# -- the invariants ------------------------------------------------------------------------
def check(observed: Observed, *, final_states: set[str], reruns_allowed: int = 0,
          why_reruns: str = "") -> None:
    """Assert the invariants: every job reached exactly one final state in final_states;
    no job is not-final; at most one applied result per job (Priostack: one applying
    complete/fail that ended it; Pipelogiq: one accepted result per execution); handler ran
    at most once per job except for at most `reruns_allowed` jobs (why_reruns says which
    protocol rule makes the re-run unavoidable); nothing left in flight in the ledger.
    Assertion messages name the job ids and the scenario facts."""
    o = observed
    facts = o.facts()
    assert o.jobs > 0, f"the sandbox holds no jobs: nothing was checked. {facts}"
    stranded = {jid: o.states.get(jid, "?") for jid in o.not_final}
    assert not stranded, (f"jobs not final (stranded or lost): {stranded}; "
                          f"unsettled delivery tokens: {o.unsettled}. {facts}")
    wrong = {jid: s for jid, s in o.states.items() if s not in final_states}
    assert not wrong, f"jobs ended outside {sorted(final_states)}: {wrong}. {facts}"
    assert not o.problems, f"applied results break one-outcome-per-job: {o.problems}. {facts}"
    assert not o.unknown_runs, f"handler ran for job ids the server does not hold: {o.unknown_runs}. {facts}"
    assert len(o.reruns) <= reruns_allowed, (
        f"handler ran more than once for {o.reruns} (allowed for {reruns_allowed} jobs"
        f"{': ' + why_reruns if why_reruns else ''}). {facts}")
    assert not o.reruns or why_reruns, f"re-runs {o.reruns} allowed without a documented reason. {facts}"
    left = {s: n for s, n in o.ledger.items() if not LedgerStatus(s).is_final}
    assert not left and o.in_flight == 0, f"ledger still in flight: {left}, index count {o.in_flight}. {facts}"


# -- the table rows ------------------------------------------------------------------------
def matrix_path() -> Path:
    """Where rows go: $SWTEST_FAULT_MATRIX_OUT, else .fault-matrix.jsonl in the repo root."""
    return Path(os.environ.get("SWTEST_FAULT_MATRIX_OUT") or _ROOT / ".fault-matrix.jsonl")


def _append(row: dict[str, Any]) -> None:
    # One write() on an O_APPEND descriptor: xdist workers sharing the file never interleave.
    line = (json.dumps(row, sort_keys=True, default=str) + "\n").encode()
    fd = os.open(matrix_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def record_row(scenario: str, observed: Observed, outcome: str, *, why_reruns: str = "") -> None:
    """Append one JSON line {scenario, protocol, outcome, jobs, final, reruns, faults_fired,
    duplicates_discarded} to the file named by env var SWTEST_FAULT_MATRIX_OUT (default
    `.fault-matrix.jsonl` in the repo root, gitignored). Appends are one write() each so
    xdist workers can share the file."""
    row: dict[str, Any] = {
        "scenario": scenario, "protocol": observed.protocol, "outcome": outcome, "jobs": observed.jobs,
        "final": dict(observed.final), "reruns": dict(observed.reruns),
        "faults_fired": dict(observed.faults_fired), "duplicates_discarded": observed.duplicates_discarded,
    }
    if why_reruns:
        row["why_reruns"] = why_reruns
    _append(row)


def record_na(scenario: str, protocol: str, why: str) -> None:
    """A row for a scenario that does not apply to the protocol: outcome ``n/a: <why>``."""
    _append({"scenario": scenario, "protocol": protocol, "outcome": f"n/a: {why}", "jobs": 0, "final": {},
             "reruns": {}, "faults_fired": {}, "duplicates_discarded": 0})
