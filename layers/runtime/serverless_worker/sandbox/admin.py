"""A small client for a sandbox's admin API, used by tests, the local runner and benchmarks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import requests

__all__ = ["JobView", "SandboxAdmin", "job_id", "job_view", "server_state"]


def job_id(protocol: str, job: dict[str, Any]) -> str:
    """The id a handler sees as ``job.job_id``, from one of ``SandboxAdmin.jobs()``' records."""
    return str({"pipelogiq": job.get("job_id"), "priostack": job.get("key")}.get(protocol, job.get("id")))


def server_state(protocol: str, job: dict[str, Any]) -> str:
    """The job's state on the server, one word (a claim-queue item finished with an error
    result is ``error``): what the reliability checks and the soak count outcomes by."""
    if protocol == "pipelogiq":
        return str(job["status"]).lower()
    if protocol == "priostack":
        return str(job["state"])
    if job["status"] == "finished" and isinstance(job.get("result"), dict) and "error" in job["result"]:
        return "error"
    return str(job["status"])


@dataclass(frozen=True)
class JobView:
    """One job of ``SandboxAdmin.jobs()`` as a user reads it, whichever sandbox: the id the
    handler saw, the handler, its state on the server, and what the worker sent back."""

    job_id: str
    handler: str
    state: str
    result: Any = None      # the result the worker reported (Priostack: the process variables)
    error: str | None = None


def job_view(job: dict[str, Any]) -> JobView:
    """A record of any sandbox's ``GET /_admin/jobs`` as a :class:`JobView` (each sandbox
    names its fields its own way: Pipelogiq ``job_id``, Priostack ``key``, claim queue ``id``)."""
    if "stageName" in job:  # Pipelogiq: a stage; its output is the result's JSON text
        output = job.get("output")
        try:
            result = json.loads(output) if isinstance(output, str) else output
        except ValueError:
            result = output
        return JobView(job_id("pipelogiq", job), str(job.get("handler")),
                       server_state("pipelogiq", job), result, job.get("errorCode"))
    if "key" in job:  # Priostack: a completion merges its variables into the process instance's
        instance = job.get("instance") or {}
        state = server_state("priostack", job)
        return JobView(job_id("priostack", job), str(job.get("type")), state,
                       instance.get("variables") if state == "completed" else None, job.get("error_message"))
    return JobView(job_id("claimqueue", job), str(job.get("queue")), server_state("claimqueue", job),
                   job.get("result"), job.get("error"))


class SandboxAdmin:
    """Seed jobs, read histories, switch faults and timeouts of a running sandbox."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._http = requests.Session()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        resp = self._http.request(method, f"{self.base_url}/_admin/{path}", json=body, timeout=self.timeout)
        resp.raise_for_status()
        return resp.json()

    def seed(self, body: Any) -> Any:
        return self._call("POST", "jobs", body)["created"]

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "jobs")["jobs"]

    def faults(self, rules: list[dict[str, Any]], seed: int = 0) -> Any:
        return self._call("POST", "faults", {"seed": seed, "rules": rules})

    def clear_faults(self) -> Any:
        return self._call("DELETE", "faults")

    def configure(self, **config: Any) -> dict[str, Any]:
        return self._call("POST", "config", config)

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "stats")

    def reset(self) -> None:
        self._call("POST", "reset")

    def overview(self) -> dict[str, Any]:
        """Pipelogiq only: workers, sessions, pulls, requests and what is in flight."""
        return self._call("GET", "pipelogiq")

    def revoke(self, job_id: str | int) -> dict[str, Any]:
        """Pipelogiq only: revoke a stage's lease, as an operator would."""
        return self._call("POST", "pipelogiq/revoke", {"jobId": job_id})

    def close(self) -> None:
        self._http.close()
