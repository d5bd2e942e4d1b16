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
    handler saw, the handler, its state on the server, how many times it was handed out,
    and what the worker sent back: the result, or the error's code and whole message (a
    business error's details too)."""

    job_id: str
    handler: str
    state: str
    result: Any = None      # the result the worker reported (Priostack: the process variables)
    code: str | None = None      # the error code of a failure or a business error
    message: str | None = None   # and its message, in full
    details: Any = None          # a business error's variables
    attempts: int | None = None  # deliveries of the job (attempts), duplicates left out


def job_view(job: dict[str, Any]) -> JobView:
    """A record of any sandbox's ``GET /_admin/jobs`` as a :class:`JobView` (each sandbox
    names its fields its own way: Pipelogiq ``job_id``, Priostack ``key``, claim queue ``id``)."""
    if "stageName" in job:
        return _pipelogiq_view(job)
    if "key" in job:
        return _priostack_view(job)
    return _claimqueue_view(job)


def _pipelogiq_view(job: dict[str, Any]) -> JobView:
    """A stage: its output is the result's JSON text; an error's message is the last result
    the worker sent (a business rejection's is JSON: code, message, variables)."""
    output = job.get("output")
    code = job.get("errorCode")
    message: str | None = None
    details: Any = None
    if code is not None:
        sent = next((event.get("result") for event in reversed(job.get("history") or [])
                     if event.get("event") == "result_received" and event.get("isSuccess") is False), None)
        rejection = _json(sent) if isinstance(sent, str) else sent
        if isinstance(rejection, dict) and "code" in rejection:
            code, message, details = rejection.get("code"), rejection.get("message"), rejection.get("variables")
        elif sent is not None:
            message = sent if isinstance(sent, str) else json.dumps(sent)
    attempts = len(job.get("executions") or []) or job.get("attempt")
    return JobView(job_id("pipelogiq", job), str(job.get("handler")), server_state("pipelogiq", job),
                   _json(output) if isinstance(output, str) else output, code, message, details,
                   int(attempts) if attempts is not None else None)


def _priostack_view(job: dict[str, Any]) -> JobView:
    """A service task: a completion merges its variables into the process instance's (the
    result); a business rejection is a completion whose variables carry ``errorCode`` and
    ``errorMessage``; a failure says its ``errorMessage``."""
    instance = job.get("instance") or {}
    state = server_state("priostack", job)
    variables = instance.get("variables") if state == "completed" else None
    code = message = details = None
    completed = next((call.get("body") or {} for call in reversed(job.get("calls") or [])
                      if call.get("action") == "complete" and call.get("applied")), {})
    sent = completed.get("variables") if isinstance(completed, dict) else None
    if isinstance(sent, dict) and "errorCode" in sent:
        code, message = sent.get("errorCode"), sent.get("errorMessage")
        details = {k: v for k, v in sent.items() if k not in ("errorCode", "errorMessage")} or None
    elif job.get("error_message") is not None:
        message = job.get("error_message")  # the worker's "CODE: message" (the state says incident)
    attempts = sum(1 for activation in job.get("activations") or [] if not activation.get("duplicate"))
    return JobView(job_id("priostack", job), str(job.get("type")), state, variables, code, message, details,
                   attempts)


def _claimqueue_view(job: dict[str, Any]) -> JobView:
    """An item: its result record, whose ``error`` and ``errorCode`` say a failure."""
    result = job.get("result")
    code = message = details = None
    if isinstance(result, dict) and "error" in result:
        code, message = result.get("errorCode"), result.get("error")
        details = {k: v for k, v in result.items() if k not in ("error", "errorCode")} or None
    elif job.get("error") is not None:
        message = str(job.get("error"))
    attempts = job.get("attempts")
    return JobView(job_id("claimqueue", job), str(job.get("queue")), server_state("claimqueue", job), result,
                   code, message, details, int(attempts) if attempts is not None else None)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


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
