"""Worker sessions (optimistic versions, expiry checked on read), the bootstrap lock,
counters and the control flags."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import SecretStr

from serverless_worker.model import SessionState
from serverless_worker.state import StaleWriteError, StateStore

RawItem = Callable[[str, str], dict[str, Any] | None]


def _session(clock: Any, token: str = "session-token-s3cr3t", lifetime: float = 3600) -> SessionState:
    return SessionState(worker_id="w-1", token=SecretStr(token), issued_at=clock.now,
                        expires_at=clock.now + lifetime, heartbeat_interval=10.0,
                        attributes={"appId": "app_12", "ratio": 0.5})


# -- sessions --------------------------------------------------------------------------


def test_no_session_loads_as_none(store: StateStore) -> None:
    assert store.load_session("pipelogiq", "blue") is None


def test_a_saved_session_loads_with_its_token_and_version(store: StateStore, clock: Any) -> None:
    session = _session(clock)

    version = store.save_session("pipelogiq", "blue", session, None)

    assert version == 1
    loaded = store.load_session("pipelogiq", "blue")
    assert loaded is not None
    restored, loaded_version = loaded
    assert loaded_version == 1
    assert restored.token.get_secret_value() == "session-token-s3cr3t"
    assert restored.model_dump() == session.model_dump()


def test_saving_with_the_loaded_version_bumps_it(store: StateStore, clock: Any) -> None:
    store.save_session("pipelogiq", "blue", _session(clock), None)

    version = store.save_session("pipelogiq", "blue", _session(clock, token="t2"), 1)

    assert version == 2
    loaded = store.load_session("pipelogiq", "blue")
    assert loaded is not None and loaded[1] == 2 and loaded[0].token.get_secret_value() == "t2"


def test_a_stale_version_is_refused(store: StateStore, clock: Any) -> None:
    store.save_session("pipelogiq", "blue", _session(clock), None)
    store.save_session("pipelogiq", "blue", _session(clock, token="winner"), 1)

    with pytest.raises(StaleWriteError) as refused:
        store.save_session("pipelogiq", "blue", _session(clock, token="loser-token"), 1)

    assert "loser-token" not in str(refused.value)
    loaded = store.load_session("pipelogiq", "blue")
    assert loaded is not None and loaded[0].token.get_secret_value() == "winner"


def test_creating_over_a_live_session_is_refused(store: StateStore, clock: Any) -> None:
    store.save_session("pipelogiq", "blue", _session(clock), None)

    with pytest.raises(StaleWriteError):
        store.save_session("pipelogiq", "blue", _session(clock, token="second"), None)


def test_an_expired_session_reads_as_absent_before_ttl_deletes_it(store: StateStore, clock: Any,
                                                                  raw_item: RawItem) -> None:
    store.save_session("pipelogiq", "blue", _session(clock, lifetime=30), None)
    store.save_session("pipelogiq", "blue", _session(clock, lifetime=30), 1)

    clock.advance(31)

    assert raw_item("session#pipelogiq#blue", "session") is not None  # TTL has not run
    assert store.load_session("pipelogiq", "blue") is None
    # What load_session reports as absent can be replaced as absent; the version keeps counting.
    assert store.save_session("pipelogiq", "blue", _session(clock), None) == 3


def test_sessions_are_per_protocol_and_instance(store: StateStore, clock: Any) -> None:
    store.save_session("pipelogiq", "blue", _session(clock, token="a"), None)
    store.save_session("pipelogiq", "blue#2", _session(clock, token="b"), None)

    blue, other = store.load_session("pipelogiq", "blue"), store.load_session("pipelogiq", "blue#2")
    assert blue is not None and blue[0].token.get_secret_value() == "a"
    assert other is not None and other[0].token.get_secret_value() == "b"
    assert store.load_session("priostack", "blue") is None


# -- the bootstrap lock -------------------------------------------------------------------


def test_a_lock_has_one_holder_until_it_expires(store: StateStore, clock: Any) -> None:
    name = "bootstrap#pipelogiq#blue"

    assert store.acquire_lock(name, "invocation-a", 30) is True
    assert store.acquire_lock(name, "invocation-b", 30) is False
    assert store.acquire_lock(name, "invocation-a", 30) is True  # the holder may extend it

    clock.advance(31)
    assert store.acquire_lock(name, "invocation-b", 30) is True
    assert store.acquire_lock(name, "invocation-a", 30) is False


def test_only_the_holder_releases_a_lock(store: StateStore, clock: Any) -> None:
    name = "bootstrap#pipelogiq#blue"
    store.acquire_lock(name, "invocation-a", 5)
    clock.advance(6)
    store.acquire_lock(name, "invocation-b", 5)

    assert store.release_lock(name, "invocation-a") is False  # expired and taken over
    assert store.acquire_lock(name, "invocation-a", 5) is False
    assert store.release_lock(name, "invocation-b") is True
    assert store.release_lock(name, "invocation-b") is False
    assert store.acquire_lock(name, "invocation-a", 5) is True


# -- counters and control -------------------------------------------------------------------


def test_counters_add_up(store: StateStore) -> None:
    assert store.read_counters("pipelogiq", "blue") == {}

    store.add_counters("pipelogiq", "blue", processed=1, failed=1)
    store.add_counters("pipelogiq", "blue", processed=2, handed_back=1)
    store.add_counters("pipelogiq", "green", processed=5)

    assert store.read_counters("pipelogiq", "blue") == {"processed": 3, "failed": 1, "handed_back": 1}
    assert store.read_counters("pipelogiq", "green") == {"processed": 5}


def test_counter_names_may_be_reserved_words_or_clash_with_placeholders(store: StateStore) -> None:
    store.add_counters("pipelogiq", "blue", status=1, size=2, now=3, running=4)

    assert store.read_counters("pipelogiq", "blue") == {"status": 1, "size": 2, "now": 3, "running": 4}


@pytest.mark.parametrize("deltas", [{"pk": 1}, {"ttl": 1}, {"updated_at": 1}, {"bad-name": 1}, {"x": 1.5},
                                    {"x": True}])
def test_bad_counters_are_refused_before_any_request(store: StateStore, deltas: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        store.add_counters("pipelogiq", "blue", **deltas)
    assert store.ops["write"] == 0


def test_no_deltas_make_no_request(store: StateStore) -> None:
    store.add_counters("pipelogiq", "blue")
    assert store.ops["write"] == 0


def test_control_flags(store: StateStore) -> None:
    off = {"stopped": None, "draining": False, "unfit": {}}
    assert store.get_control("pipelogiq", "blue") == off

    store.set_draining("pipelogiq", "blue", True)
    store.set_stopped("pipelogiq", "blue", "lease refused: application_mismatch")
    assert store.set_unfit("pipelogiq", "blue", "resize.v2", "timeout 30s > lease 20s") is True
    assert store.set_unfit("pipelogiq", "blue", "resize.v2", "again") is False  # set once, first reason kept
    assert store.get_control("pipelogiq", "blue") == {"stopped": "lease refused: application_mismatch",
                                                      "draining": True,
                                                      "unfit": {"resize.v2": "timeout 30s > lease 20s"}}
    assert store.get_control("pipelogiq", "green") == off

    store.set_stopped("pipelogiq", "blue", None)
    store.set_draining("pipelogiq", "blue", False)
    store.clear_unfit("pipelogiq", "blue")
    assert store.get_control("pipelogiq", "blue") == off
