"""Soak: push many jobs through the local runtime against a faulty sandbox, and count losses.

Not a test and not timed: it runs ``serverless-worker local``'s runner (embedded moto, the
thread-pool "Lambda", the real scheduler/executor code) against a sandbox job server on
loopback (in a child process) that injects random faults, then reads the server's own
history and reports

- jobs seeded, and jobs **lost**: seeded but never in a final server state (exit 1 if any);
- final outcomes by kind (the server's states, and per job kind);
- handler re-runs and duplicate deliveries discarded;
- wall time and jobs/s; resident memory (RSS) of the worker's process at start, at end and its
  peak (the sandbox's, which holds every job's history, separately).

A table on stdout, JSON in ``--out``. ``make soak`` runs it with the defaults (10,000 jobs per
protocol, concurrency 32, 5% faults). Pipelogiq and the claim queue recover a lost answer by
themselves (visibility timeout, lease recovery, lease lapse); Priostack cannot: a job whose
activation answer was lost stays active until the server restarts (docs/protocols.md), so between
passes the soak restarts the sandbox as an operator would, and reports how many it stranded.

The same file is the handler module of the run (loaded by path, as ``SW_HANDLER_MODULE``).

Example::

    .venv/bin/python scripts/soak.py --jobs 2000 --protocol claimqueue
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from serverless_worker import BusinessError, Job, handler
from serverless_worker.sandbox.admin import job_id, server_state

__all__ = ["HANDLER", "RUNS", "SoakJob", "main", "soak_job"]

HANDLER = "soak.mixed"
PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
FINAL = {"pipelogiq": {"completed", "failed"}, "priostack": {"completed", "incident"},
         "claimqueue": {"finished", "error", "failed"}}
# Short server timeouts so a lost answer comes back within seconds, not the defaults' minutes.
SANDBOX = {"pipelogiq": {"lease_seconds": 10, "visibility_timeout": 10, "poll_interval": 0.05},
           "priostack": {}, "claimqueue": {"lease_seconds": 15, "timeout_seconds": 86400}}
# Local runner passes: the first does the work; another follows while jobs are still open
# (a pass ends once idle; an answer lost late comes back after it), until one moves nothing.
MAX_PASSES = 10
# Of the jobs: this share of each failing kind; the rest succeed.
KINDS = {"reject": 0.02, "boom": 0.02, "bad": 0.01}


# -- the handler (this module loaded by path is the run's handler module) ------------------
class _Runs:
    """Handler runs per job id, thread-safe (executors run on a thread pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: Counter[str] = Counter()

    def add(self, job_id: str) -> None:
        with self._lock:
            self._runs[job_id] += 1

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._runs)

    def distinct(self) -> int:
        with self._lock:
            return len(self._runs)

    def reset(self) -> None:
        with self._lock:
            self._runs.clear()


RUNS = _Runs()


class SoakJob(BaseModel):
    kind: Literal["echo", "reject", "boom", "bad"]
    n: int
    amount: float = Field(gt=0)  # "bad" jobs send -1: the model refuses them, the body never runs


@handler(HANDLER, input=SoakJob)
def soak_job(job: Job[SoakJob]) -> dict[str, object]:
    RUNS.add(job.job_id or "")
    if job.input.kind == "reject":
        raise BusinessError("OUT_OF_STOCK", "nothing left", {"n": job.input.n})
    if job.input.kind == "boom":
        raise ValueError("boom: the handler failed")
    return {"n": job.input.n}


# -- measuring -------------------------------------------------------------------------------
def rss_mb() -> float:
    """Resident set size now (VmRSS), in MiB; ru_maxrss where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RssSampler(threading.Thread):
    """The peak RSS of one pass, sampled every half second (VmHWM is the whole process's)."""

    def __init__(self, jobs_run: Any) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.peak = rss_mb()
        self.series: list[tuple[float, int, float]] = []  # (seconds, jobs run, RSS MiB) every 15 s
        self._jobs_run = jobs_run
        self._halt = threading.Event()

    def run(self) -> None:
        started = last = time.monotonic()
        while not self._halt.wait(0.5):
            now, rss = time.monotonic(), rss_mb()
            self.peak = max(self.peak, rss)
            if now - last >= 15:
                last = now
                self.series.append((round(now - started), self._jobs_run(), round(rss, 1)))

    def stop(self) -> float:
        self._halt.set()
        self.join(2)
        self.peak = max(self.peak, rss_mb())
        return self.peak


# -- one protocol ------------------------------------------------------------------------------
def job_kinds(jobs: int, seed: int) -> list[str]:
    kinds = [kind for kind, share in KINDS.items() for _ in range(round(jobs * share))]
    kinds += ["echo"] * (jobs - len(kinds))
    random.Random(seed).shuffle(kinds)
    return kinds


def seed_body(protocol: str, kinds: list[str]) -> dict[str, Any]:
    """One admin seed body for every job; failing jobs get one server-side retry."""
    inputs = [{"kind": kind, "n": n, "amount": -1 if kind == "bad" else 1.0} for n, kind in enumerate(kinds)]
    if protocol == "pipelogiq":
        return {"pipelines": [{"name": f"soak-{v['n']}", "stages": [{
            "stageName": HANDLER, "stageHandlerName": HANDLER, "input": json.dumps(v),
            "options": {"maxRetries": 1, "retryInterval": 0} if v["kind"] == "boom" else {}}]} for v in inputs]}
    if protocol == "priostack":
        return {"jobs": [{"type": HANDLER, "variables": v, "retries": 2 if v["kind"] == "boom" else 3}
                         for v in inputs]}
    return {"queue": HANDLER, "items": inputs}


def fault_rules(protocol: str, rate: float) -> list[dict[str, Any]]:
    """About ``rate`` of all calls meet a generic fault (split over 5xx, 429, latency and dropped
    answers); ``rate`` of pulls deliver a duplicate; Pipelogiq sessions expire at rate/10."""
    rules: list[dict[str, Any]] = [
        {"kind": "error_5xx", "endpoint": "*", "probability": rate * 0.3},
        {"kind": "rate_limit", "endpoint": "*", "probability": rate * 0.15, "retry_after": 0.5},
        {"kind": "latency", "endpoint": "*", "probability": rate * 0.3, "latency_ms": 100},
        {"kind": "drop_response", "endpoint": "*", "probability": rate * 0.25},
        {"kind": "duplicate_delivery", "endpoint": PULL_LABEL[protocol], "probability": rate},
    ]
    if protocol == "pipelogiq":
        rules.append({"kind": "expire_session", "endpoint": "*", "probability": rate / 10})
    return rules




def settings_for(protocol: str, url: str, key: str, args: argparse.Namespace) -> Any:
    from serverless_worker.local.defaults import LOCAL_DEFAULTS
    from serverless_worker.local.settings import LocalSettings

    return LocalSettings(**{**LOCAL_DEFAULTS, "protocol": protocol, "base_url": url, "api_key": key,
                            "handler_module": str(Path(__file__).resolve()), "handlers": HANDLER,
                            "executor_reserved_concurrency": args.concurrency, "max_in_flight": args.concurrency,
                            "batch_size": args.batch_size, "until_idle_seconds": args.until_idle,
                            "instance_id": f"soak-{protocol}", "log_level": "WARNING"})


def run_passes(protocol: str, settings: Any, admin: Any, server_url: str, jobs: int, progress: Any,
               task: Any, runs: _Runs, retention: int | None = None) -> dict[str, Any]:
    """Local runner passes until every job is final, or a pass finished no job; Priostack
    restarts between passes to free jobs stranded by lost activation answers."""
    import requests
    from rich.console import Console

    from serverless_worker.local.worker import LocalRunner

    class Runner(LocalRunner):
        """Keeps the run's summary (the ledger's view) instead of only printing it."""

        summary: Any = None
        duplicates = 0  # redeliveries the scheduler found in the ledger and settled unrun

        def _summary(self, *args: Any, **kwargs: Any) -> Any:
            self.summary = super()._summary(*args, **kwargs)
            return self.summary

        def _after_tick(self, report: Any) -> bool:
            self.duplicates += int(report.duplicates)
            return bool(super()._after_tick(report))

    facts: dict[str, Any] = {"passes": 0, "exit_statuses": [], "restarts": 0, "stranded_by_lost_activation": 0,
                             "ledger": Counter()}
    done = threading.Event()

    def show() -> None:
        printed = time.monotonic()
        while not done.wait(0.5):
            progress.update(task, completed=min(jobs, runs.distinct()))
            if not progress.console.is_terminal and time.monotonic() - printed >= 30:
                printed = time.monotonic()  # no live bar in a pipe or CI log: a line every 30 s
                progress.console.print(f"{protocol}: {runs.distinct()}/{jobs} jobs run, RSS {rss_mb():.0f} MiB")

    watcher = threading.Thread(target=show, name="progress", daemon=True)
    watcher.start()
    try:
        finals = -1
        for _ in range(MAX_PASSES):
            facts["passes"] += 1
            with open(os.devnull, "w") as sink:
                extra = {"ledger_retention_seconds": retention} if retention else {}
                runner = Runner(settings, own_sandbox=False, console=Console(file=sink), live=False, **extra)
                facts["exit_statuses"].append(runner.run())
            summary = runner.summary
            if summary is not None:
                facts["busy_seconds"] = facts.get("busy_seconds", 0.0) + (summary.busy_seconds or 0.0)
                facts["ledger"].update({"deliveries": summary.deliveries, "discarded": summary.discarded,
                                        "duplicates": runner.duplicates,
                                        "handed_back": summary.handed_back, "in_flight": summary.in_flight,
                                        "executor_errors": summary.executor_errors,
                                        "handler_runs": summary.handler_runs})
            states = Counter(server_state(protocol, job) for job in admin.jobs())
            open_jobs = {s: n for s, n in states.items() if s not in FINAL[protocol]}
            now_final = sum(n for s, n in states.items() if s in FINAL[protocol])
            if not open_jobs or (now_final == finals and not open_jobs.get("active")):
                break  # done, or a whole pass moved nothing: what is open now counts as lost
            finals = now_final
            if protocol == "priostack" and open_jobs.get("active"):
                # Nothing of ours runs now (the runner drained): active jobs are stranded.
                facts["stranded_by_lost_activation"] += open_jobs["active"]
                requests.post(f"{server_url}/_admin/restart", timeout=30).raise_for_status()
                facts["restarts"] += 1
    finally:
        done.set()
        watcher.join(2)
    return facts


def _serve(protocol: str, config: dict[str, Any], url_out: Any) -> None:
    """Child process: the sandbox job server, until terminated."""
    from serverless_worker.sandbox import create_sandbox
    from serverless_worker.sandbox._server import SandboxServer

    server = SandboxServer(create_sandbox(protocol, **config)).start()  # returns once listening
    url_out.send(server.url)
    threading.Event().wait()


class SandboxProcess:
    """The sandbox in a process of its own, so the soak's RSS and CPU are the worker's alone
    (the sandbox keeps every job's full history in memory)."""

    def __init__(self, protocol: str, config: dict[str, Any]) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        self.process = context.Process(target=_serve, args=(protocol, config, send), daemon=True,
                                       name=f"sandbox-{protocol}")
        self.process.start()
        if not receive.poll(60):
            raise RuntimeError(f"the {protocol} sandbox did not start")
        self.url: str = receive.recv()

    def rss_mb(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def stop(self) -> None:
        self.process.terminate()
        self.process.join(10)


def soak_protocol(protocol: str, args: argparse.Namespace, progress: Any) -> dict[str, Any]:
    import requests

    from serverless_worker.local.demo import new_key, sandbox_credential_config
    from serverless_worker.registry import load_handlers
    from serverless_worker.sandbox.admin import SandboxAdmin

    runs: _Runs = load_handlers(Path(__file__).resolve()).RUNS  # the copy the runner calls
    runs.reset()
    key = new_key()
    rss_start = rss_mb()
    sampler = RssSampler(runs.distinct)
    sampler.start()
    server = SandboxProcess(protocol, {**sandbox_credential_config(protocol, key), **SANDBOX[protocol]})
    admin = SandboxAdmin(server.url, timeout=120)
    try:
        kinds = job_kinds(args.jobs, args.seed)
        created = admin.seed(seed_body(protocol, kinds))
        ids = [str(i) for i in (created["jobIds"] if protocol == "pipelogiq" else created)]
        kind_of = dict(zip(ids, kinds, strict=True))
        admin.faults(fault_rules(protocol, args.fault_rate), seed=args.seed)
        task = progress.add_task(f"{protocol}", total=args.jobs)
        started = time.monotonic()
        # One state file for all of this sandbox's passes (each pass is a restart of the same
        # worker on it), and none beyond it: a fresh sandbox hands out the same job ids again.
        with tempfile.TemporaryDirectory(prefix=f"soak-{protocol}-") as state_dir:
            settings = settings_for(protocol, server.url, key, args).model_copy(
                update={"state_path": str(Path(state_dir) / "state.sqlite3")})
            facts = run_passes(protocol, settings, admin, server.url, args.jobs, progress, task, runs,
                               retention=args.ledger_retention)
        seconds = time.monotonic() - started
        progress.update(task, completed=args.jobs)
        jobs = {job_id(protocol, job): job for job in admin.jobs()}
        answer = requests.get(f"{server.url}/_admin/faults", timeout=120)
        answer.raise_for_status()
        fired = Counter(f"{f['kind']}@{f['endpoint']}" for f in answer.json()["fired"])
        stats = admin.stats()
        sandbox_rss = server.rss_mb()
    finally:
        admin.close()
        server.stop()
    states = {jid: server_state(protocol, job) for jid, job in jobs.items()}
    lost = sorted(jid for jid in kind_of if states.get(jid) not in FINAL[protocol])
    run_counts = runs.counts()
    reruns = {jid: n for jid, n in run_counts.items() if n > 1}
    by_kind: dict[str, Counter[str]] = {}
    for jid, kind in kind_of.items():
        by_kind.setdefault(kind, Counter())[states.get(jid, "missing")] += 1
    rss_end = rss_mb()
    return {
        "protocol": protocol,
        "jobs_seeded": len(kind_of),
        "jobs_lost": len(lost),
        "lost_ids": lost[:50],
        "final": dict(Counter(states.values())),
        "final_by_kind": {kind: dict(c) for kind, c in sorted(by_kind.items())},
        "handler_runs": sum(run_counts.values()),
        "jobs_rerun": len(reruns),
        "reruns_by_kind": dict(Counter(kind_of.get(jid, "?") for jid in reruns)),
        "duplicates_delivered": sum(n for key, n in fired.items() if key.startswith("duplicate_delivery")),
        "duplicates_discarded": int(facts["ledger"].get("duplicates", 0)),
        "ledger_discarded": int(facts["ledger"].get("discarded", 0)),
        "deliveries": int(facts["ledger"].get("deliveries", 0)),
        "handed_back": int(facts["ledger"].get("handed_back", 0)),
        "executor_errors": int(facts["ledger"].get("executor_errors", 0)),
        "faults_fired": sum(fired.values()),
        "faults_by_kind": dict(Counter(key.partition("@")[0] for key in fired.elements())),
        "server_calls": sum(stats.get("calls", {}).values()),
        "passes": facts["passes"],
        "exit_statuses": facts["exit_statuses"],
        "restarts": facts["restarts"],
        "stranded_by_lost_activation": facts["stranded_by_lost_activation"],
        "seconds": round(seconds, 1),
        "jobs_per_second": round(len(kind_of) / seconds, 1) if seconds else None,
        # first pull to last reported result (without start-up and the idle tail of each pass)
        "busy_seconds": round(facts.get("busy_seconds", 0.0), 1),
        "busy_jobs_per_second": (round(len(kind_of) / facts["busy_seconds"], 1)
                                 if facts.get("busy_seconds") else None),
        # the soak process (runner, embedded moto, executors); the sandbox runs in a child
        "rss_mb": {"start": round(rss_start, 1), "end": round(rss_end, 1), "peak": round(sampler.stop(), 1)},
        "sandbox_rss_mb_end": round(sandbox_rss, 1) if sandbox_rss is not None else None,
        "rss_series": sampler.series,  # (seconds, jobs run, RSS MiB): growth per job, or a plateau
    }


# -- the command ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per protocol (default 10000)")
    parser.add_argument("--concurrency", type=int, default=32, help="executor threads (default 32)")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="share of calls meeting a fault (0.05)")
    parser.add_argument("--seed", type=int, default=5150, help="seeds the fault plan and the job mix")
    parser.add_argument("--protocol", action="append", choices=PROTOCOLS,
                        help="repeatable; default all three, one after another")
    parser.add_argument("--batch-size", type=int, default=32, help="most deliveries per pull call (32)")
    parser.add_argument("--until-idle", type=float, default=20.0,
                        help="a pass ends after this long without a new job (above the sandbox's 10-15 s "
                             "visibility and lease timeouts, so lost answers come back first)")
    parser.add_argument("--ledger-retention", type=int, default=None,
                        help="seconds a settled ledger item stays in the embedded table before the TTL "
                             "sweep deletes it (default: the local runner's, 600); short values show "
                             "the memory plateau within a short soak")
    parser.add_argument("--out", type=Path, default=Path("bench-results/soak.json"), help="JSON results")
    args = parser.parse_args(argv)
    if not 0 <= args.fault_rate <= 1:
        parser.error("--fault-rate must be between 0 and 1")
    return args


def render(results: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table(title="soak")
    table.add_column("")
    for result in results:
        table.add_column(result["protocol"], justify="right")
    rows = [
        ("jobs seeded", "jobs_seeded"), ("jobs lost", "jobs_lost"), ("final outcomes", "final"),
        ("handler runs", "handler_runs"), ("jobs re-run (by kind)", "reruns_by_kind"),
        ("duplicates delivered / discarded", None), ("faults fired", "faults_fired"),
        ("stranded by lost activation (restarts)", None), ("passes", "passes"),
        ("wall time s (busy)", None), ("jobs/s (busy)", None), ("RSS MiB start / end / peak", None),
        ("sandbox RSS MiB at end", "sandbox_rss_mb_end"),
    ]
    for label, key in rows:
        cells = []
        for r in results:
            if label.startswith("duplicates"):
                cells.append(f"{r['duplicates_delivered']} / {r['duplicates_discarded']}")
            elif label.startswith("stranded"):
                cells.append(f"{r['stranded_by_lost_activation']} ({r['restarts']})")
            elif label.startswith("wall"):
                cells.append(f"{r['seconds']} ({r['busy_seconds']})")
            elif label.startswith("jobs/s"):
                cells.append(f"{r['jobs_per_second']} ({r['busy_jobs_per_second']})")
            elif label.startswith("RSS"):
                cells.append(" / ".join(f"{r['rss_mb'][k]:.0f}" for k in ("start", "end", "peak")))
            else:
                value = r[key]
                cells.append(", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else str(value))
        table.add_row(label, *cells)
    return table


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    args = parse_args(argv)
    protocols = args.protocol or list(PROTOCOLS)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # The runtime's warnings (retries, recoveries: many under faults) go to a log beside the JSON.
    logging.basicConfig(filename=args.out.with_suffix(".log"), filemode="w", level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    console = Console()
    console.print(f"soak: {args.jobs} jobs per protocol, concurrency {args.concurrency}, "
                  f"{args.fault_rate:.0%} faults, seed {args.seed}: {', '.join(protocols)}")
    results: list[dict[str, Any]] = []
    meta = {"jobs": args.jobs, "concurrency": args.concurrency, "fault_rate": args.fault_rate, "seed": args.seed,
            "batch_size": args.batch_size, "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
            "rss_mb_process_start": round(rss_mb(), 1)}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        for protocol in protocols:
            results.append(soak_protocol(protocol, args, progress))
            args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    console.print(render(results))
    lost = sum(r["jobs_lost"] for r in results)
    console.print(f"results in {args.out}; runtime log in {args.out.with_suffix('.log')}")
    if lost:
        console.print(f"[bold red]{lost} jobs lost[/]")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
