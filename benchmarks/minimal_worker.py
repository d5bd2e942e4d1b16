"""The baseline: a hand-rolled worker that makes only the calls each protocol requires,
with the same concurrency and batch size as the runtime, against the same sandbox.

- Pipelogiq: bootstrap once, then per job pull, lease acquire, result, ack.
- Priostack: activate a batch, then complete each job.
- Claim queue: claim, then post the result.

No ledger, no retries, no validation beyond what it needs to address the next call: the
least a correct happy-path worker can do. One puller thread keeps at most ``concurrency``
jobs in flight (as the scheduler does); ``concurrency`` runner threads work them.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from .harness import HANDLER

__all__ = ["MinimalWorker"]

# What each protocol's documents say to wait after an empty poll (the runtime's values too).
_EMPTY_BACKOFF = {"pipelogiq": 0.0, "priostack": 1.0, "claimqueue": 2.0}
_TIMEOUT = (3.05, 30.0)


class MinimalWorker:
    """Runs ``count`` jobs of the ``bench`` handler; ``note(created)`` plays the handler."""

    def __init__(self, protocol: str, base_url: str, credential: str, *, concurrency: int, batch_size: int,
                 note: Callable[[float | None], None]) -> None:
        self.protocol = protocol
        self.base_url = base_url.rstrip("/")
        self.concurrency = concurrency
        self.batch_size = batch_size
        self._credential = credential
        self._note = note
        self._http = requests.Session()
        self._http.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=concurrency + 4))
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._free = threading.Semaphore(concurrency)
        self._stop = threading.Event()
        self._done = 0
        self._done_lock = threading.Lock()
        self._finished = threading.Event()
        self._target = 0
        self._session: dict[str, str] = {}
        self.errors: list[str] = []

    # -- the run -----------------------------------------------------------------------
    def run(self, count: int, timeout: float) -> float | None:
        """Work ``count`` jobs; seconds from start (bootstrap included) to the last settle."""
        self._target = count
        started = time.perf_counter()
        if self.protocol == "pipelogiq":
            self._bootstrap()
        threads = [threading.Thread(target=self._puller, name="minimal-pull", daemon=True)]
        threads += [threading.Thread(target=self._runner, name=f"minimal-run-{i}", daemon=True)
                    for i in range(self.concurrency)]
        for thread in threads:
            thread.start()
        finished = self._finished.wait(timeout)
        took = time.perf_counter() - started
        self._stop.set()
        for thread in threads[1:]:
            thread.join(5)
        return took if finished else None

    def close(self) -> None:
        self._stop.set()
        self._http.close()

    @property
    def done(self) -> int:
        with self._done_lock:
            return self._done

    def _puller(self) -> None:
        while not self._stop.is_set():
            self._free.acquire()
            room = 1
            while room < self.batch_size and self._free.acquire(blocking=False):
                room += 1
            try:
                jobs = self._pull(room)
            except requests.RequestException as err:
                jobs = []
                self.errors.append(f"pull: {type(err).__name__}")
            for _ in range(room - len(jobs)):
                self._free.release()
            for job in jobs:
                self._jobs.put(job)
            if not jobs and _EMPTY_BACKOFF[self.protocol]:
                self._stop.wait(_EMPTY_BACKOFF[self.protocol])

    def _runner(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                self._work(job)
            except (requests.RequestException, KeyError, ValueError) as err:
                self.errors.append(f"work: {type(err).__name__}: {err}"[:200])
            finally:
                self._free.release()
            with self._done_lock:
                self._done += 1
                if self._done >= self._target:
                    self._finished.set()

    def _post(self, path: str, body: Any, headers: dict[str, str]) -> requests.Response:
        response = self._http.post(self.base_url + path, data=json.dumps(body), timeout=_TIMEOUT,
                                   headers={"Content-Type": "application/json", **headers})
        if response.status_code >= 300 and response.status_code != 204:
            raise requests.HTTPError(f"{path.split('/')[1]} answered {response.status_code}")
        return response

    # -- protocols ---------------------------------------------------------------------
    def _pull(self, room: int) -> list[Any]:
        if self.protocol == "pipelogiq":
            jobs = []
            for index in range(room):  # one delivery per call; only the first one waits
                response = self._post("/jobs/pull", {"queue": self._session["queue"],
                                                     "waitSeconds": 1 if index == 0 else 0}, self._key())
                if response.status_code == 204:
                    break
                jobs.append(response.json())
            return jobs
        if self.protocol == "priostack":
            answer = self._post("/api/v1/jobs/activate", {"type": HANDLER, "maxJobsToActivate": room},
                                self._key()).json()
            return list(answer["jobs"])
        jobs = []
        for _ in range(room):
            answer = self._post(f"/{HANDLER}/claim", {"worker": "minimal"}, self._bearer()).json()
            if answer.get("empty"):
                break
            jobs.append(answer)
        return jobs

    def _work(self, job: Any) -> None:
        if self.protocol == "pipelogiq":
            payload = job["payload"] if isinstance(job["payload"], dict) else json.loads(job["payload"])
            stage = payload["stageId"]
            lease = self._post(f"/stages/{stage}/lease/acquire", {
                "executionId": payload["executionId"], "workerId": self._session["worker"]}, self._worker())
            if not lease.json().get("acquired"):
                raise ValueError("lease refused")
            value = self._handle(payload.get("input"))
            self._post(f"/stages/{stage}/result", {
                "pipelineId": payload["pipelineId"], "stageId": stage, "executionId": payload["executionId"],
                "attempt": payload["attempt"], "isSuccess": True, "result": json.dumps(value)},
                {**self._key(), **self._worker()})
            self._post("/jobs/ack", {"token": job["token"], "requeue": False}, {})
        elif self.protocol == "priostack":
            value = self._handle(job.get("variables"))
            self._post(f"/api/v1/jobs/{job['key']}/complete", {"variables": value}, self._key())
        else:
            value = self._handle(job.get("item"))
            self._post(f"/{HANDLER}/items/{job['id']}/result", value, self._bearer())

    def _handle(self, data: Any) -> dict[str, Any]:
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except ValueError:
                data = None
        created = data.get("t") if isinstance(data, dict) else None
        self._note(float(created) if isinstance(created, int | float) else None)
        return {"ok": True}

    def _bootstrap(self) -> None:
        answer = self._post("/workers/bootstrap", {"workerName": "minimal", "instanceId": "minimal",
                                                   "supportedHandlers": [HANDLER]}, self._key()).json()
        pattern = answer["queues"]["stageNextPattern"]
        app_id = answer["application"]["appId"]
        self._session = {"worker": answer["workerId"], "token": answer["workerSessionToken"],
                         "queue": pattern.replace("{appId}", app_id).replace("{handler}", HANDLER)}

    def _key(self) -> dict[str, str]:
        return {"X-API-Key": self._credential}

    def _worker(self) -> dict[str, str]:
        return {"X-Worker-Session": self._session["token"]}

    def _bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._credential}"}
