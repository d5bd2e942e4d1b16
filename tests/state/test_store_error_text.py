"""Every error text a state store records (a settle failure, a hand-back or discard reason,
a stop or unfit reason) passes through logsafety.server_text: a credential a server echoed
is cut out and control characters are escaped, on every backend."""

from __future__ import annotations

from collections.abc import Callable

from serverless_worker import logsafety
from serverless_worker.model import Delivery
from serverless_worker.state import StateStore

KEY = "api-key-echoed-7c41d0"
ECHO = f"BadRequestError: result: rejected: headers x-api-key: {KEY}; \x1b[2J\r\nX-Injected: yes\x00\x9b"
ESCAPED = "\\x1b[2J\\r\\nX-Injected: yes\\x00\\x9b"


def _clean(text: str | None) -> None:
    assert text is not None and ESCAPED in text
    assert KEY not in text and logsafety.REDACTED in text
    assert all(control not in text for control in ("\x1b", "\r", "\n", "\x00", "\x9b"))


def test_recorded_error_texts_are_redacted_and_escaped(store: StateStore,
                                                       make_delivery: Callable[..., Delivery]) -> None:
    logsafety.register_secret(KEY)
    failing = store.record_delivery(make_delivery("e-1"), instance="blue", deadline=store._clock() + 60,
                                    dispatch_mode="invoke")
    handed = store.record_delivery(make_delivery("e-2"), instance="blue", deadline=store._clock() + 60,
                                   dispatch_mode="invoke")
    assert failing is not None and handed is not None
    assert store.note_settle_failure(failing, ECHO, retry_at=store._clock() + 5) == 1
    assert store.mark_handed_back(handed, ECHO)
    store.set_stopped("pipelogiq", "blue", ECHO)
    store.set_unfit("pipelogiq", "blue", "h", ECHO)

    for key in (failing, handed):
        item = store.get(key)
        assert item is not None
        _clean(item.error)
    control = store.get_control("pipelogiq", "blue")
    _clean(control["stopped"])
    _clean(control["unfit"]["h"])
