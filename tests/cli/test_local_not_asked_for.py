"""CLI tier: ``serverless-worker local`` against a server that answers its pulls with work it
did not ask for (another type or handler, an item outside the criteria): each such delivery
is given back untouched, summed in the summary, and the run says so and exits 1; on the
server's own record no handler ran for it and no attempt was used.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import CLI, SANDBOX_KEYS, SECRET, clean_env, row
from test_local_crash import _input

pytestmark = pytest.mark.cli

__all__ = ["SANDBOX_KEYS"]  # read by the `sandbox` fixture

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
PULL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
HANDLERS = '''
import os
import pathlib

from serverless_worker import handler


@handler("mine", criteria={"format": "jpg"})
def mine(job):
    pathlib.Path(os.environ["RUN_MARKS"], str(job.input["n"])).touch()
    return {"n": job.input["n"]}
'''


def _seed(admin: Any, protocol: str) -> None:
    """Two jobs of ours and one foreign: another handler's, or (claim queue) an item of our
    queue outside our criteria, seeded first so it is the oldest."""
    if protocol == "pipelogiq":
        admin.seed({"handler": "theirs", "inputs": [{"n": 9, "format": "jpg"}]})
        admin.seed({"handler": "mine", "inputs": [{"n": 0, "format": "jpg"}, {"n": 1, "format": "jpg"}]})
    elif protocol == "priostack":
        admin.seed({"jobs": [{"type": "theirs", "variables": {"n": 9, "format": "jpg"}, "retries": 3}]})
        admin.seed({"jobs": [{"type": "mine", "variables": {"n": n, "format": "jpg"}, "retries": 3}
                             for n in (0, 1)]})
    else:
        admin.seed({"queue": "mine", "items": [{"n": 9, "format": "png"}, {"n": 0, "format": "jpg"},
                                               {"n": 1, "format": "jpg"}]})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_delivery_not_asked_for_is_given_back_and_summed(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server that answers one pull with a job this worker did not ask for
    server, admin = sandbox(protocol, **({"lease_seconds": 5} if protocol == "claimqueue" else {}))
    _seed(admin, protocol)
    admin.faults([{"kind": "foreign_delivery", "endpoint": PULL[protocol], "count": 1}])
    module, marks = tmp_path / "handlers.py", tmp_path / "marks"
    module.write_text(HANDLERS)
    marks.mkdir()

    # when the worker runs until idle
    done = subprocess.run([str(CLI), "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "K",
                           "--handler-module", str(module), "--handlers", "mine", "--until-idle-seconds", "2",
                           "--state", str(tmp_path / "state.sqlite3")],
                          cwd=tmp_path, env=clean_env(K=SECRET, RUN_MARKS=str(marks)), capture_output=True,
                          text=True, timeout=120)
    out = done.stdout + done.stderr

    # then the run names it, sums it in the summary and exits 1
    assert done.returncode == 1, out
    assert admin.stats()["faults_fired"] == 1, out
    assert "was not asked for" in out and "given back untouched" in out, out
    assert row(out, "not asked for") == 1, out
    assert "did not ask for, each given back untouched" in out, out
    # and its own jobs ran, the foreign one never did
    assert sorted(int(p.name) for p in marks.iterdir()) == [0, 1], out
    assert row(out, "done") == 2, out
    # and on the server the foreign job used no attempt and raised no incident
    (foreign,) = [job for job in admin.jobs() if _input(protocol, job)["n"] == 9]
    if protocol == "priostack":
        assert (foreign["state"], foreign["retries"], foreign["incident"]) == ("waiting", 3, None), foreign
        assert [(c["action"], c["body"]["retries"]) for c in foreign["calls"]] == [("fail", 3)], foreign
    elif protocol == "pipelogiq":
        assert foreign["status"] == "Pending" and foreign["failures"] == 0, foreign
        assert "requeue" in [e["event"] for e in foreign["history"]], foreign["history"]
    else:
        events = [e["event"] for e in foreign["history"]]
        assert events.count("claim") == 1 and "result" not in events, events
        assert foreign["status"] in ("processing", "pending"), foreign  # its lease lapses: no result
