"""runtime.entry: AWS setup problems end an invocation as one ConfigurationError; the
project's own errors and anything else pass through untouched."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ReadTimeoutError,
)

from serverless_worker.errors import ConfigurationError, ServerUnavailableError
from serverless_worker.runtime import entry
from serverless_worker.runtime.context import LocalContext
from serverless_worker.state.errors import StateStoreError
from support.template import TEMPLATE_PATH


def _client_error(code: str, operation: str = "GetItem") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} happened"}}, operation)


@pytest.mark.parametrize(("err", "fragment"), [
    (NoRegionError(), "no AWS region configured"),
    (NoCredentialsError(), "no usable AWS credentials"),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "cannot reach the AWS endpoint http://127.0.0.1:1"),
    (_client_error("ResourceNotFoundException"), "not found (ResourceNotFoundException on GetItem"),
    (_client_error("StateMachineDoesNotExist", "StartExecution"), "SW_STATE_MACHINE_ARN"),
    (_client_error("AccessDeniedException"), "AWS refused the credentials or permissions"),
    (_client_error("UnrecognizedClientException"), "UnrecognizedClientException"),
])
def test_aws_setup_errors_become_one_configuration_error(err: Exception, fragment: str) -> None:
    clear = entry.aws_setup_error(err)

    assert isinstance(clear, ConfigurationError)
    assert fragment in str(clear)


@pytest.mark.parametrize("err", [
    _client_error("ThrottlingException"),         # transient: retrying may help
    _client_error("ConditionalCheckFailedException"),
    ReadTimeoutError(endpoint_url="http://x"),     # the call may have happened
    ValueError("not AWS at all"),
])
def test_other_errors_are_not_configuration(err: Exception) -> None:
    assert entry.aws_setup_error(err) is None


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A complete worker configuration in an environment with no AWS region anywhere."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("SW_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("SW_API_KEY", "k")
    monkeypatch.setenv("SW_TABLE_NAME", "StateTable")
    monkeypatch.setenv("SW_HANDLER_MODULE", str(TEMPLATE_PATH.parent / "functions" / "handlers"))
    entry.reset_services()
    yield
    entry.reset_services()


@pytest.mark.parametrize(("call", "event"), [
    (entry.drain_worker, {"grace_seconds": 0}),
    (entry.execute_delivery, {"ledger_key": "delivery#pipelogiq#1"}),
    (entry.state_machine_step, {"step": "renew", "ledger_key": "delivery#pipelogiq#1", "epoch": "e"}),
    (entry.scheduler_tick, {}),
])
def test_entry_points_turn_a_missing_region_into_a_configuration_error(
        no_region: None, call: Any, event: dict[str, Any]) -> None:
    # when a real entry point builds its DynamoDB client with no region configured
    with pytest.raises(ConfigurationError, match="no AWS region configured") as raised:
        call(event, LocalContext("test", timeout_seconds=30))

    # then the botocore error is the cause, not what the caller sees
    assert isinstance(raised.value.__cause__, NoRegionError)


@pytest.mark.parametrize("err", [
    StateStoreError("DynamoDB get_item for x failed: ResourceNotFoundException"),
    ServerUnavailableError("transport failure", endpoint="bootstrap"),
])
def test_project_errors_pass_unchanged(err: Exception) -> None:
    @entry._clear_errors
    def failing(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise err

    with pytest.raises(type(err)) as raised:
        failing({}, LocalContext())

    assert raised.value is err


def test_unrelated_errors_pass_unchanged() -> None:
    @entry._clear_errors
    def failing(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise KeyError("epoch")

    with pytest.raises(KeyError):
        failing({}, LocalContext())


@pytest.mark.parametrize(("in_lambda", "root", "setting", "expected"), [
    (True, logging.WARNING, "INFO", logging.INFO),     # Lambda's root level no longer drops INFO lines
    (True, logging.DEBUG, "INFO", logging.DEBUG),      # never raised above what is already let through
    (False, logging.WARNING, "INFO", logging.WARNING),  # outside Lambda, logging is whoever set it up
])
def test_the_package_logs_at_its_setting_in_lambda(monkeypatch: pytest.MonkeyPatch, in_lambda: bool, root: int,
                                                    setting: str, expected: int) -> None:
    from serverless_worker.runtime.entry import _package_log_level

    if in_lambda:
        monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "serverless-worker-test")
    else:
        monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    monkeypatch.setattr(logging.getLogger(), "level", root)
    _package_log_level(setting)
    assert logging.getLogger("serverless_worker").getEffectiveLevel() == expected


@pytest.mark.parametrize("event", [
    pytest.param({}, id="empty"),
    pytest.param({"ledger_key": ""}, id="empty-key"),
    pytest.param({"pull": True}, id="pull-flag-without-a-key"),
    pytest.param({"pull": {"handler": "h"}}, id="puller-without-by"),
    pytest.param({"pull": {"handler": "", "by": 1.0}}, id="puller-without-handler"),
    pytest.param({"pull": {"handler": "h", "by": True}}, id="puller-by-a-bool"),
    pytest.param(["ledger_key"], id="not-an-object"),
])
def test_an_executor_event_of_no_known_shape_is_refused_before_anything_is_built(event: Any) -> None:
    # no environment at all: the event is checked first, and its error names the shapes
    with pytest.raises(ConfigurationError, match='"ledger_key"') as raised:
        entry.execute_delivery(event, LocalContext("test", timeout_seconds=30))
    assert '"pull": {"handler"' in str(raised.value)
