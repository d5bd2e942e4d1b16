"""Settings from SW_* variables, their validation messages, and where the API key comes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws

from serverless_worker.credentials import resolve_api_key
from serverless_worker.errors import ConfigurationError
from serverless_worker.settings import environment_values, load_settings

SECRET = "sk-live-DO-NOT-PRINT-123"
HTTPS = "https://jobs.example.com"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SW_* variable from the surrounding shell leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("SW_"):
            monkeypatch.delenv(name)


def problems(**overrides: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**overrides)
    return str(caught.value)


# -- defaults and parsing -----------------------------------------------------------------

def test_defaults_need_only_the_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SW_BASE_URL", HTTPS + "/")

    s = load_settings()

    assert s.base_url == HTTPS  # trailing slash dropped
    assert (s.protocol, s.handlers, s.handler_module, s.criteria, s.instance_id) == (
        "pipelogiq", [], "functions.handlers", {}, "serverless-worker")
    assert (s.api_key, s.api_key_secret_arn, s.api_key_parameter) == (None, None, None)
    assert (s.batch_size, s.max_in_flight, s.poll_window_seconds, s.schedule_seconds) == (10, 50, 50, 60)
    assert (s.lease_renew_seconds, s.wait_seconds_long_poll) == (30, 20)
    assert (s.session_ttl_seconds, s.session_refresh_margin_seconds) == (86400, 3600)
    assert (s.executor_function_name, s.state_machine_arn, s.table_name, s.executor_reserved_concurrency) == (
        None, None, None, None)
    assert (s.report_margin_seconds, s.allow_insecure_http, s.log_level) == (10, False, "INFO")
    assert (s.connect_timeout, s.read_timeout) == (3.05, 10)


def test_environment_values_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "SW_PROTOCOL": "ClaimQueue",
        "SW_BASE_URL": "http://jobs.internal:8080/api",
        "SW_ALLOW_INSECURE_HTTP": "true",
        "SW_API_KEY": SECRET,
        "SW_HANDLERS": " resize , thumbnail,,resize ",
        "SW_CRITERIA": json.dumps({"resize": {"format": "jpg", "width": {"lte": 2000}}}),
        "SW_BATCH_SIZE": "25",
        "SW_EXECUTOR_RESERVED_CONCURRENCY": "40",
        "SW_LOG_LEVEL": "warn",
        "SW_TABLE_NAME": "worker-table",
        "SW_STATE_MACHINE_ARN": "",  # empty means unset, as SAM passes optional parameters
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    s = load_settings()

    assert s.protocol == "claimqueue"
    assert s.base_url == "http://jobs.internal:8080/api"
    assert s.api_key is not None and s.api_key.get_secret_value() == SECRET
    assert s.handlers == ["resize", "thumbnail"]
    assert s.criteria == {"resize": {"format": "jpg", "width": {"lte": 2000}}}
    assert (s.batch_size, s.executor_reserved_concurrency, s.log_level) == (25, 40, "WARNING")
    assert (s.table_name, s.state_machine_arn) == ("worker-table", None)


def test_variable_names_match_in_any_case_and_other_sw_variables_are_ignored(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("sw_base_url", HTTPS)
    monkeypatch.setenv("Sw_Batch_Size", "8")
    monkeypatch.setenv("SW_NOT_A_SETTING", "1")   # a typo in the environment is not an error...
    monkeypatch.setenv("SW_MAX_IN_FLIGHT", "")     # ...and an empty variable is unset

    s = load_settings()

    assert (s.base_url, s.batch_size, s.max_in_flight) == (HTTPS, 8, 50)
    assert "SW_BATCHSIZE: unknown setting" in problems(base_url=HTTPS, batchsize=8)  # ...a typo in code is


def test_environment_values_are_the_settings_variables_as_text() -> None:
    environ = {"SW_BATCH_SIZE": "25", "sw_handlers": "a,b", "SW_TABLE_NAME": "", "SW_BOGUS": "x",
               "BATCH_SIZE": "3", "PATH": "/bin"}

    assert environment_values(environ) == {"batch_size": "25", "handlers": "a,b"}


def test_handlers_may_be_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SW_HANDLERS", '["echo", "payment-processor"]')
    assert load_settings(base_url=HTTPS).handlers == ["echo", "payment-processor"]


def test_overrides_win_over_the_environment_and_none_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SW_BASE_URL", HTTPS)
    monkeypatch.setenv("SW_BATCH_SIZE", "5")

    s = load_settings(batch_size=7, protocol=None, handlers=["a"])

    assert (s.base_url, s.batch_size, s.protocol, s.handlers) == (HTTPS, 7, "pipelogiq", ["a"])


def test_plain_http_to_loopback_is_allowed() -> None:
    for url in ("http://localhost:8081", "http://127.0.0.1:8081", "http://[::1]:8081"):
        assert load_settings(base_url=url).base_url == url


def test_secrets_are_masked_in_repr() -> None:
    s = load_settings(base_url=HTTPS, api_key=SECRET)
    assert SECRET not in repr(s)
    assert SECRET not in str(s)


def test_importing_settings_does_not_import_boto3_or_powertools() -> None:
    code = ("import sys, serverless_worker.settings, serverless_worker.credentials; "
            "print(sorted(m for m in ('boto3', 'botocore', 'aws_lambda_powertools', 'requests') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- validation messages ---------------------------------------------------------------

@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, "SW_BASE_URL: required but not set"),
    ({"base_url": "ftp://jobs.example.com"}, "SW_BASE_URL: must be an http(s) URL with a host"),
    ({"base_url": "jobs.example.com"}, "SW_BASE_URL: must be an http(s) URL with a host"),
    ({"base_url": "https://jobs.example.com/?k=1"}, "SW_BASE_URL: must not have a query string"),
    ({"base_url": "http://jobs.example.com"}, "SW_BASE_URL: plain http:// is allowed only to loopback"),
    ({"protocol": "kafka"}, "SW_PROTOCOL: Input should be 'pipelogiq', 'priostack' or 'claimqueue'"),
    ({"batch_size": 0}, "SW_BATCH_SIZE: Input should be greater than or equal to 1"),
    ({"batch_size": 1001}, "SW_BATCH_SIZE: Input should be less than or equal to 1000"),
    ({"max_in_flight": 0}, "SW_MAX_IN_FLIGHT: Input should be greater than or equal to 1"),
    ({"poll_window_seconds": 841}, "SW_POLL_WINDOW_SECONDS: Input should be less than or equal to 840"),
    ({"lease_renew_seconds": 0}, "SW_LEASE_RENEW_SECONDS: Input should be greater than 0"),
    ({"wait_seconds_long_poll": 21}, "SW_WAIT_SECONDS_LONG_POLL: Input should be less than or equal to 20"),
    ({"executor_reserved_concurrency": 0}, "SW_EXECUTOR_RESERVED_CONCURRENCY: Input should be greater"),
    ({"log_level": "loud"}, "SW_LOG_LEVEL: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ({"instance_id": "has space"}, "SW_INSTANCE_ID: String should match pattern"),
    ({"handlers": "ok,not ok"}, "SW_HANDLERS: invalid handler name(s) 'not ok'"),
    ({"handlers": "[not json"}, "SW_HANDLERS: is not a valid JSON list"),
    ({"criteria": "{not json"}, "SW_CRITERIA: is not valid JSON"),
    ({"criteria": '{"resize": "jpg"}'}, "SW_CRITERIA: must map each handler name to a JSON object"),
    ({"handlers": "resize", "criteria": {"thumb": {"format": "png"}}},
     "SW_CRITERIA: criteria for handler(s) not in SW_HANDLERS: thumb"),
    ({"api_key_secret_arn": "arn:aws:secretsmanager:eu-west-1:1:secret:k", "api_key_parameter": "/k"},
     "SW_API_KEY_SECRET_ARN, SW_API_KEY_PARAMETER: set at most one source for the API key"),
    ({"table_name": "has space"}, "SW_TABLE_NAME: must be a name or ARN without spaces"),
    ({"session_ttl_seconds": 600, "session_refresh_margin_seconds": 600},
     "SW_SESSION_REFRESH_MARGIN_SECONDS: must be less than SW_SESSION_TTL_SECONDS"),
    ({"batchsize": 5}, "SW_BATCHSIZE: unknown setting"),
])
def test_each_bad_setting_is_named(overrides: dict[str, Any], expected: str) -> None:
    base = {"base_url": HTTPS} if "base_url" not in overrides and overrides else {}
    message = problems(**{**base, **overrides})
    assert message.startswith("invalid settings:\n")
    assert expected in message


def test_criteria_are_free_when_handlers_are_not_listed() -> None:
    assert load_settings(base_url=HTTPS, criteria={"any": {"x": 1}}).criteria == {"any": {"x": 1}}


def test_insecure_http_can_be_allowed_explicitly() -> None:
    s = load_settings(base_url="http://jobs.example.com", allow_insecure_http=True)
    assert s.base_url == "http://jobs.example.com"


def test_every_bad_setting_is_listed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SW_BATCH_SIZE", "zero")
    monkeypatch.setenv("SW_MAX_IN_FLIGHT", "-1")
    message = problems(base_url="nope", api_key=SECRET)

    lines = message.splitlines()[1:]
    assert [line.split(":")[0].strip() for line in lines] == [
        "SW_BASE_URL", "SW_BATCH_SIZE", "SW_MAX_IN_FLIGHT"]


def test_no_secret_or_url_credential_appears_in_error_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SW_API_KEY", SECRET)
    message = problems(base_url=f"https://user:{SECRET}@jobs.example.com", batch_size=0)

    assert "SW_BASE_URL: must not carry credentials" in message
    assert SECRET not in message

    with pytest.raises(ConfigurationError) as caught:
        load_settings(base_url=HTTPS, api_key=12345)
    assert "SW_API_KEY: Input should be a valid string" in str(caught.value)
    assert "12345" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# -- the API key ---------------------------------------------------------------------

@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Secrets Manager and SSM emulated in-process; Powertools caches emptied around each test."""
    for name, value in {"AWS_DEFAULT_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(name, value)
    parameters.clear_caches()
    with mock_aws():
        yield
    parameters.clear_caches()


def test_a_local_key_comes_straight_from_the_settings() -> None:
    key = resolve_api_key(load_settings(base_url=HTTPS, api_key=SECRET))
    assert key.get_secret_value() == SECRET


def test_no_key_source_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="no API key configured: set SW_API_KEY"):
        resolve_api_key(load_settings(base_url=HTTPS))


def test_a_secret_is_read_once_cached_and_re_read_on_refresh(aws: None) -> None:
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name="worker/api-key", SecretString="key-v1")["ARN"]
    settings = load_settings(base_url=HTTPS, api_key_secret_arn=arn)

    assert resolve_api_key(settings).get_secret_value() == "key-v1"
    sm.put_secret_value(SecretId=arn, SecretString="key-v2")  # rotated
    assert resolve_api_key(settings).get_secret_value() == "key-v1"  # still cached
    assert resolve_api_key(settings, refresh=True).get_secret_value() == "key-v2"


def test_a_key_value_secret_is_read_from_its_api_key_field(aws: None) -> None:
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name="worker/json", SecretString=json.dumps({"api_key": " key-json "}))["ARN"]
    settings = load_settings(base_url=HTTPS, api_key_secret_arn=arn)
    assert resolve_api_key(settings).get_secret_value() == "key-json"

    arn = sm.create_secret(Name="worker/other", SecretString=json.dumps({"password": SECRET}))["ARN"]
    with pytest.raises(ConfigurationError, match="JSON object without an api_key field") as caught:
        resolve_api_key(load_settings(base_url=HTTPS, api_key_secret_arn=arn))
    assert SECRET not in str(caught.value)


def test_an_ssm_secure_string_is_decrypted(aws: None) -> None:
    boto3.client("ssm").put_parameter(Name="/worker/api-key", Value="key-ssm", Type="SecureString")
    settings = load_settings(base_url=HTTPS, api_key_parameter="/worker/api-key")
    assert resolve_api_key(settings).get_secret_value() == "key-ssm"


def test_an_unreadable_secret_is_a_configuration_error_naming_the_source(aws: None) -> None:
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:missing-AbCdEf"
    with pytest.raises(ConfigurationError, match="could not read the API key from Secrets Manager") as e:
        resolve_api_key(load_settings(base_url=HTTPS, api_key_secret_arn=arn))
    assert arn in str(e.value)


def test_an_empty_secret_is_refused(aws: None) -> None:
    boto3.client("ssm").put_parameter(Name="/worker/blank", Value=" ", Type="SecureString")
    with pytest.raises(ConfigurationError, match="is empty"):
        resolve_api_key(load_settings(base_url=HTTPS, api_key_parameter="/worker/blank"))
