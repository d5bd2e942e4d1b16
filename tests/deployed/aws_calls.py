"""The deployed tier's record for ``make iam-proof``: every AWS API call each function made.

Every stack the tier deploys sets ``RecordAwsCalls=true``, so its functions print one
``{"aws_call": ...}`` line per call (``serverless_worker/awscall_log.py``). Right after a
stack is deployed its resources are read (their physical names, for the roles' ARNs); at
the end of the session, while LocalStack still runs, each function's log group (kept when
a stack is deleted: ``DeletionPolicy: Retain``) is read for those lines. Both go to
``RECORD_PATH``, which ``scripts/iam_proof.py`` evaluates against the roles of the built
template.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployed.localstack import REGION, ROOT, DeployedStack, clients, log_lines

__all__ = ["RECORD_PATH", "CallRecord"]

RECORD_PATH = ROOT / ".aws-sam" / "deployed" / "aws-calls.json"
_MARK = '{"aws_call"'


@dataclass
class CallRecord:
    """The stacks deployed so far (as they stood after the deploy), written by :meth:`write`."""

    template: Path
    stacks: list[dict[str, Any]] = field(default_factory=list)
    _deployed: list[DeployedStack] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # stacks deploy on a thread pool

    def deployed(self, stack: DeployedStack, template: Path | None = None) -> None:
        """Note a stack just deployed (its outputs loaded): its parameters and resources."""
        resources: list[dict[str, str]] = []
        cloudformation = clients("cloudformation")
        for page in cloudformation.get_paginator("list_stack_resources").paginate(StackName=stack.name):
            resources += [{"logical": r["LogicalResourceId"], "physical": r.get("PhysicalResourceId", ""),
                           "type": r["ResourceType"]} for r in page["StackResourceSummaries"]]
        entry = {"name": stack.name, "protocol": stack.protocol, "parameters": dict(stack.parameters),
                 "template": str(template or self.template), "resources": resources,
                 "functions": {logical: {"name": stack.outputs[f"{logical}Name"], "calls": []}
                               for logical in stack.functions}}
        with self._lock:
            self.stacks.append(entry)
            self._deployed.append(stack)

    def collect(self, stack: DeployedStack) -> None:
        """Read ``stack``'s function logs for their calls now: before its ``sam delete``, which
        in LocalStack may take the log groups with it."""
        with self._lock:
            entries = [entry for entry, noted in zip(self.stacks, self._deployed, strict=True) if noted is stack]
        for entry in entries:
            for function in entry["functions"].values():
                messages = log_lines(stack.logs, f"/aws/lambda/{function['name']}")
                function["calls"] = [call for message in messages for call in _calls(message)]
            entry["collected"] = True

    def write(self) -> Path:
        """Collect what :meth:`collect` has not yet, and write the record."""
        for entry, stack in zip(self.stacks, self._deployed, strict=True):
            if not entry.get("collected"):
                self.collect(stack)
        account = clients("sts").get_caller_identity()["Account"]
        RECORD_PATH.parent.mkdir(parents=True, exist_ok=True)
        RECORD_PATH.write_text(json.dumps({"region": REGION, "account": account, "stacks": self.stacks}, indent=1))
        return RECORD_PATH


def _calls(message: str) -> list[dict[str, Any]]:
    """The recorded calls in one log event: LocalStack may put several lines of a function's
    output in one event, and a run without the recorder's line lock (an older build) could
    run two lines together, so every JSON object on every line is read."""
    calls: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for line in message.splitlines():
        at = line.find(_MARK)
        while at != -1:
            record, end = decoder.raw_decode(line, at)
            calls.append(record["aws_call"])
            at = line.find(_MARK, end)
    return calls
