"""awsclients: clients built on first use, all on one boto3 session, AWS setup errors as one
ConfigurationError. AWS is moto, in-process."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities import parameters
from moto import mock_aws

from serverless_worker.awsclients import LazyClient, check_region, shared_session
from serverless_worker.credentials import resolve_api_key
from serverless_worker.errors import ConfigurationError
from serverless_worker.settings import load_settings
from serverless_worker.state import DynamoStateStore
from support.aws_env import use_fake_aws_credentials
from support.dynamodb import create_state_table

REGION = "eu-west-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_fake_aws_credentials(monkeypatch, REGION)
    parameters.clear_caches()
    with mock_aws():
        yield
    parameters.clear_caches()


@pytest.fixture
def calls_seen() -> Iterator[Any]:
    """``calls_seen(event)``: operation names of every call made through the shared session."""
    registered: list[tuple[str, Any]] = []

    def watch(event: str) -> list[str]:
        seen: list[str] = []

        def note(model: Any, **_: Any) -> None:
            seen.append(model.name)

        shared_session().events.register(event, note)
        registered.append((event, note))
        return seen

    yield watch
    for event, note in registered:
        shared_session().events.unregister(event, note)


def test_a_store_builds_its_client_on_the_first_call_on_the_shared_session(aws: None, calls_seen: Any) -> None:
    table = create_state_table(boto3.client("dynamodb", region_name=REGION)).name
    seen = calls_seen("before-call.dynamodb.GetItem")

    store = DynamoStateStore(table)
    client = store._client
    assert isinstance(client, LazyClient) and not client.built

    assert store.load_session("pipelogiq", "blue") is None  # a real GetItem, on moto

    assert client.built
    assert seen == ["GetItem"]  # the client was built on the shared session
    assert shared_session() is boto3.DEFAULT_SESSION


def test_the_client_is_built_once(aws: None) -> None:
    lazy = LazyClient("dynamodb")

    first = lazy.client
    assert lazy.client is first
    assert lazy.list_tables()["TableNames"] == []
    assert lazy.client is first


def test_copying_or_inspecting_the_proxy_builds_nothing() -> None:
    lazy = LazyClient("dynamodb")

    assert not hasattr(lazy, "__deepcopy__")
    copy.copy(lazy)
    assert repr(lazy) == "LazyClient('dynamodb', built=False)"
    assert not lazy.built


def test_no_region_is_one_configuration_error_from_the_first_call(
        aws: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a session that reads the empty config
    store = DynamoStateStore("StateTable")  # building the runtime still works

    with pytest.raises(ConfigurationError, match="no AWS region configured") as raised:
        store.load_session("pipelogiq", "blue")
    assert not store._client.built
    assert type(raised.value.__cause__).__name__ == "NoRegionError"


def test_an_unknown_profile_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)

    with pytest.raises(ConfigurationError, match="no usable AWS credentials"):
        LazyClient("dynamodb").list_tables()


@pytest.mark.parametrize("source", ["secret", "parameter"])
def test_the_api_key_is_read_through_the_shared_session(aws: None, calls_seen: Any, source: str) -> None:
    if source == "secret":
        arn = boto3.client("secretsmanager").create_secret(Name="worker/key", SecretString="key-sm")["ARN"]
        settings = load_settings(base_url="https://jobs.example.com", api_key_secret_arn=arn)
        seen = calls_seen("before-call.secrets-manager.GetSecretValue")
    else:
        boto3.client("ssm").put_parameter(Name="/worker/key", Value="key-ssm", Type="SecureString")
        settings = load_settings(base_url="https://jobs.example.com", api_key_parameter="/worker/key")
        seen = calls_seen("before-call.ssm.GetParameter")

    key = resolve_api_key(settings).get_secret_value()

    assert key == ("key-sm" if source == "secret" else "key-ssm")
    assert len(seen) == 1


def test_check_region_builds_no_session_when_the_region_is_in_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)

    check_region()

    assert boto3.DEFAULT_SESSION is None


@pytest.mark.parametrize(("profile", "message"), [
    (None, "no AWS region configured"),
    ("no-such-profile", "no usable AWS credentials"),
])
def test_check_region_names_the_setup_problem(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                              profile: str | None, message: str) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    if profile:
        monkeypatch.setenv("AWS_PROFILE", profile)
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)  # the profile is checked even with a region
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)

    with pytest.raises(ConfigurationError, match=message):
        check_region()
