"""Which errors stop a local run with exit 2: decided on the error tree (errors.py), so a
subclass counts as its parent does, except the two that a retry or a re-bootstrap cures."""

from __future__ import annotations

import pytest

from serverless_worker import errors
from serverless_worker.local.worker import _is_fatal


@pytest.mark.parametrize("error_class", [
    errors.ConfigurationError, errors.AuthenticationError, errors.InvalidApiKeyError, errors.ForbiddenError,
    errors.BadRequestError, errors.NotFoundError,
])
def test_errors_no_retry_can_cure_are_fatal(error_class: type[Exception]) -> None:
    assert _is_fatal(error_class)


def test_a_subclass_defined_later_is_fatal_as_its_parent_is() -> None:
    class RevokedKeyError(errors.InvalidApiKeyError):
        pass

    assert _is_fatal(RevokedKeyError)


@pytest.mark.parametrize("error_class", [
    errors.SessionExpiredError, errors.NotFoundAfterRetryError, errors.ServerUnavailableError,
    errors.RateLimitedError, errors.ProtocolViolationError, errors.LeaseRefusedError, RuntimeError,
])
def test_errors_a_later_tick_can_get_past_are_not(error_class: type[Exception]) -> None:
    assert not _is_fatal(error_class)
