"""Text in the forms a result carries: RFC 3339 times and messages cut to a byte cap.

Shared by the handler's ``Job.log``, the result mapping (``results.py``) and the handler
runner, which all write into one :class:`~serverless_worker.model.Outcome`.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["clipped_line", "coded_message", "rfc3339", "truncate_utf8"]


def coded_message(code: str | None, message: str | None, default: str = "") -> str:
    """``"CODE: message"``, the code once: a failure's message already starts with its type
    (``ValueError: boom``, the handler runner's), and saying it twice helps nobody."""
    text = message or default
    if not code or text == code or text.startswith(f"{code}: "):
        return text
    return f"{code}: {text}" if text else code


def clipped_line(text: str, most: int) -> str:
    """``text`` on one line (runs of whitespace, newlines too, as one space), cut to ``most``
    characters with ``...``: for a list line; a full view shows the whole text."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= most else one_line[:most - 3] + "..."


def rfc3339(epoch: float) -> str:
    """``2025-01-31T12:00:00.123Z``: the form Pipelogiq wants in result logs."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def truncate_utf8(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    marker = "…[truncated]"
    keep = max(0, limit - len(marker.encode("utf-8")))
    return data[:keep].decode("utf-8", errors="ignore") + marker
