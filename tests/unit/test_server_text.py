"""logsafety.server_text: what a server says is made fit to log, raise and store in one place."""

from __future__ import annotations

import logging

import pytest

from serverless_worker import logsafety
from serverless_worker.logsafety import REDACTED, escape_controls, server_text


def test_control_characters_are_escaped_never_passed_through() -> None:
    text = server_text("a\x1b[2J\r\nX-Injected: yes\x00\x9b31m\x7f\t\u2028\u202e z")
    assert text == "a\\x1b[2J\\r\\nX-Injected: yes\\x00\\x9b31m\\x7f\\t\\u2028\\u202e z"
    assert all(ch.isprintable() for ch in text)


def test_escaping_twice_changes_nothing() -> None:
    once = server_text("C:\\path \x1b x")
    assert server_text(once) == once == "C:\\path \\x1b x"


def test_given_and_registered_secrets_and_credential_shapes_are_cut_out() -> None:
    logsafety.register_secret("registered-secret-4411")
    text = server_text("key given-secret-9876 / registered-secret-4411 / x-api-key: other-key-0001 / "
                       '"token": "tok-0002" / Authorization: Bearer bear-0003',
                       ("given-secret-9876",))
    for secret in ("given-secret-9876", "registered-secret-4411", "other-key-0001", "tok-0002", "bear-0003"):
        assert secret not in text
    assert text.count(REDACTED) == 5


def test_a_short_given_secret_is_not_cut_out_of_ordinary_words() -> None:
    assert server_text("unknown action", ("k",)) == "unknown action"


def test_the_cut_comes_after_the_redaction_so_no_part_of_a_secret_is_left() -> None:
    secret = "S" * 20 + "-tail-secret"
    text = server_text("x" * 90 + secret, (secret,), limit=100)
    assert "SSSS" not in text and text.startswith("x" * 90 + REDACTED[:10])
    assert len(text) <= 103


def test_escape_controls_leaves_printable_text_alone() -> None:
    assert escape_controls("plain ünï-ℵ text") == "plain ünï-ℵ text"


def test_a_server_given_id_logged_by_the_project_has_its_controls_escaped(caplog: pytest.LogCaptureFixture) -> None:
    # given a job key as a hostile server may hand it out, logged as the runtime logs ids
    key = "job-1\x1b[2J\r\nINFO forged line\x00"
    with caplog.at_level("INFO", logger="serverless_worker.runtime.test"):
        logging.getLogger("serverless_worker.runtime.test").info("job %s settled (%d)", key, 3)
    # then the line holds the escapes, not the controls, and the other arguments are untouched
    [record] = caplog.records
    assert record.getMessage() == "job job-1\\x1b[2J\\r\\nINFO forged line\\x00 settled (3)"


def test_a_project_format_string_keeps_its_own_line_breaks(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="serverless_worker.local.test"):
        logging.getLogger("serverless_worker.local.test").info("first\nsecond")
    assert caplog.records[0].getMessage() == "first\nsecond"
