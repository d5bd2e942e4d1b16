"""An identifier as one URL path segment that reaches the server as the same identifier.

Job keys and item ids are the server's strings and may hold anything: ``/``, ``%``,
``?``, ``#``, spaces, non-ASCII, or be ``.`` or ``..``. Each is percent-encoded as UTF-8
with nothing left reserved, and a segment of dots only is written ``%2E`` for each dot,
which no URL resolver reads as a dot segment (RFC 3986 5.2.4 removes literal ``.`` and
``..`` only). The transport also sends the path as given (``_session.exchange`` sets the
prepared request's URL after preparing it): ``requests`` would turn ``%2E%2E`` back into
``..`` and urllib3 would then collapse it, so ``/jobs/%2E%2E/complete`` would go out as
``/complete`` and strand the job.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["path_segment"]


def path_segment(value: str) -> str:
    """``value`` encoded as a single path segment (``"a/b"`` -> ``"a%2Fb"``, ``".."`` -> ``"%2E%2E"``)."""
    encoded = quote(value, safe="")
    if encoded and encoded.strip(".") == "":
        return "%2E" * len(encoded)
    return encoded
