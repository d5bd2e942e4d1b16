"""``runtime/session.needs_refresh`` as a table: a stored worker session is replaced
before use when it is missing or expires within the refresh margin."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from serverless_worker.model import SessionState
from serverless_worker.runtime.session import needs_refresh

NOW = 1_000_000.0
MARGIN = 60.0


def _session(expires_in: float) -> SessionState:
    return SessionState(worker_id="w-1", token=SecretStr("t"), issued_at=NOW - 600, expires_at=NOW + expires_in)


@pytest.mark.parametrize(("session", "refresh"), [
    pytest.param(None, True, id="no-session-yet"),
    pytest.param(_session(3600), False, id="far-from-expiry"),
    pytest.param(_session(MARGIN + 0.001), False, id="just-outside-the-margin"),
    pytest.param(_session(MARGIN), True, id="exactly-at-the-margin"),
    pytest.param(_session(1), True, id="inside-the-margin"),
    pytest.param(_session(-5), True, id="already-expired"),
])
def test_needs_refresh(session: SessionState | None, refresh: bool) -> None:
    assert needs_refresh(session, MARGIN, NOW) is refresh


def test_a_zero_margin_refreshes_only_at_expiry() -> None:
    assert needs_refresh(_session(0.5), 0.0, NOW) is False
    assert needs_refresh(_session(0.0), 0.0, NOW) is True
