"""A secret that a third-party library logs is redacted, whichever library and logger
logs it, at whatever level gets through (logsafety.py)."""

from __future__ import annotations

import logging

import pytest

from serverless_worker import logsafety

SECRET = "sk-live-7f3c9a1e2b4d"
QUERY_KEY = "qk-5e8d2c"

# A module logger of each library the worker uses, as that library names it.
THIRD_PARTY_LOGGERS = [
    "urllib3.connectionpool",
    "urllib3.util.retry",
    "requests",
    "botocore.endpoint",
    "botocore.credentials",
    "botocore.hooks",
    "boto3.resources.action",
    "stamina",
    "websockets.client",
    logsafety.WIRE_LOGGER,
]


@pytest.fixture(autouse=True)
def _registered() -> None:
    logsafety.install()
    logsafety.register_secret(SECRET)


@pytest.mark.parametrize("name", THIRD_PARTY_LOGGERS)
def test_a_registered_secret_logged_by_a_third_party_logger_is_redacted(
        name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    logger = logging.getLogger(name)

    logger.warning("request to %s failed with key %s", "https://jobs.example/x", SECRET)

    assert caplog.records, f"{name} logged nothing"
    assert SECRET not in caplog.text
    assert f"with key {logsafety.REDACTED}" in caplog.text


@pytest.mark.parametrize("name", THIRD_PARTY_LOGGERS)
def test_credential_shapes_are_redacted_without_registration(name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    logging.getLogger(name).warning('"GET /jobs?type=t&api_key=%s HTTP/1.1" 200; Authorization: Bearer %s; '
                                    '{"token": "%s"}', QUERY_KEY, QUERY_KEY, QUERY_KEY)

    assert QUERY_KEY not in caplog.text
    assert "api_key=[redacted]" in caplog.text and "Bearer [redacted]" in caplog.text


def test_a_secret_in_a_logged_traceback_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    try:
        raise ConnectionError(f"proxy refused https://jobs.example/?api_key={QUERY_KEY} for {SECRET}")
    except ConnectionError:
        logging.getLogger("urllib3.connectionpool").exception("retrying")

    formatted = logging.Formatter("%(message)s").format(caplog.records[-1])
    assert "ConnectionError" in formatted
    assert SECRET not in formatted and QUERY_KEY not in formatted and SECRET not in caplog.text


def test_the_worker_own_loggers_are_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    logging.getLogger("serverless_worker.runtime").warning("job id %s", "api_key=visible")
    logging.getLogger("urllib3x").warning("%s", SECRET)  # a name that only starts like one

    assert "api_key=visible" in caplog.text and SECRET in caplog.text


def test_body_loggers_are_held_at_info_even_with_debug_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    for name in (*logsafety.SDK_BODY_LOGGERS, logsafety.WIRE_LOGGER):
        logging.getLogger(name).debug("body %s", "anything")
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
    assert "body anything" not in caplog.text


def test_installing_twice_redacts_once_and_keeps_the_previous_factory() -> None:
    logsafety.install()
    logsafety.install()

    record = logging.getLogRecordFactory()("stamina", logging.INFO, __file__, 1, "key %s", (SECRET,), None)
    assert record.getMessage() == f"key {logsafety.REDACTED}"


def test_a_secret_too_short_to_tell_from_text_is_not_registered(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    logsafety.register_secret("api")

    logging.getLogger("urllib3.connectionpool").debug('"GET /api/v1/jobs?api_key=%s HTTP/1.1" 200', "api")

    assert '"GET /api/v1/jobs?api_key=[redacted] HTTP/1.1" 200' in caplog.text
