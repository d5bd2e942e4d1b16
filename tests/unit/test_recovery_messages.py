"""Every message that tells of something recovered from says what happened and what was
lost, or that nothing was: a user reading "recovered" must not wonder whether a job went
missing. The rule is held on the package's source, so a new message meets it too: each
logging call or worker event whose text speaks of a recovery (a re-opened session, a retry
after a failure, the reaper, a take-over, a reconnect) must say "lost" ("nothing is lost",
"nothing is lost yet", "... is lost").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import serverless_worker

PACKAGE = Path(serverless_worker.__file__).resolve().parent
RECOVERY = re.compile(r"recover|re-?bootstrap|reconnect|re-?read|re-?queued|reaper|\breap|abandon|tr(y|ies|ied) "
                      r"again|made again|\bagain\b|next tick|next cycle|retry|taken over|took it over|"
                      r"no longer owns", re.IGNORECASE)
LOG_METHODS = {"debug", "info", "warning", "error", "critical", "exception"}
# Messages that match the words but tell of no recovery, each with why.
NOT_RECOVERIES = {
    ("protocols/_http.py", "retrying "): "a call still being retried, within the bounds it names",
    ("protocols/_http.py", "(Retry-After)"): "a wait the server asked for, before a call is made again",
    ("protocols/pipelogiq.py", "lease API probe failed"): "a probe of the server's release, not of a job",
    ("protocols/priostack.py", "is malformed"): "a bad job, failed on purpose ('retries 0' is the wire value)",
    ("protocols/claimqueue.py", "handed back: work socket closed"): "a hand-back the worker chose",
    ("runtime/protocol_client.py", "not re-bootstrapping yet"): "no recovery: the error goes up to the caller",
    ("runtime/fit.py", "handed back"): "a hand-back the worker chose",
}


def _text(node: ast.expr) -> str | None:
    """A message's literal text (an f-string's placeholders as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    if isinstance(node, ast.BinOp):  # implicit concatenation across lines is one Constant already
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def recovery_messages() -> list[tuple[str, int, str]]:
    """(module, line, text) of each log call and worker event that speaks of a recovery."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            if node.func.attr in LOG_METHODS:
                text = _text(node.args[0])
            elif node.func.attr == "add" and len(node.args) >= 2 and _text(node.args[0]) is not None \
                    and "." in (_text(node.args[0]) or ""):  # events.add("worker.x", message, ...)
                text = _text(node.args[1])
            else:
                continue
            if text is None or not RECOVERY.search(text):
                continue
            if any(module == where and phrase in text for where, phrase in NOT_RECOVERIES):
                continue
            found.append((module, node.lineno, text))
    return found


def test_the_scan_finds_the_recovery_messages() -> None:
    # (so that the rule below cannot pass by finding nothing)
    texts = " | ".join(text for _, _, text in recovery_messages())
    assert "rejected the worker session" in texts and "left to the reaper" in texts, texts
    assert "tried again" in texts and "could not reap" in texts, texts


def test_every_recovery_message_says_what_was_lost_or_that_nothing_was() -> None:
    silent = [f"{module}:{line}: {text!r}" for module, line, text in recovery_messages() if "lost" not in text]

    assert not silent, "recovery messages that do not say what was lost:\n" + "\n".join(silent)


def test_the_exceptions_still_exist() -> None:
    # an exception whose message is gone or reworded must leave the list, not hide a new one
    for (module, phrase), why in NOT_RECOVERIES.items():
        assert phrase in (PACKAGE / module).read_text(encoding="utf-8"), (module, phrase, why)
