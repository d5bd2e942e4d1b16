"""The reliability suite reuses the AWS tier's ``worker_env`` and adds what its scenarios
need: the handlers of ``reliability_handlers.py`` and the API key in Secrets Manager."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from aws.conftest import Env, recorder, worker_env  # noqa: F401  (the AWS tier's fixtures, shared)

__all__ = ["HANDLERS", "Env", "SecretsManagerKey", "handlers_module", "secret_key"]

# Loaded by path through SW_HANDLER_MODULE, as a deployment loads functions/handlers.
HANDLERS = str(Path(__file__).with_name("reliability_handlers.py"))


def handlers_module() -> Any:
    """``reliability_handlers`` as the functions load it (``load_handlers`` caches the module
    under a private name), so a test reads the same ``CALLS`` the handlers write."""
    from serverless_worker.registry import load_handlers

    return load_handlers(HANDLERS)


class SecretsManagerKey:
    """The worker's API key as a Secrets Manager secret in the stack's moto, with a count of
    every GetSecretValue that reached Secrets Manager (Powertools' cache hits do not)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, patches: ExitStack, value: str) -> None:
        import boto3

        from serverless_worker import logsafety
        from serverless_worker.local.moto_adapter import count_secret_reads
        from serverless_worker.runtime.entry import reset_services

        # This fixture's own Secrets Manager calls carry the value too: hold the SDK's body
        # loggers as the worker does, so only the worker's own output is under test.
        logsafety.hold_sdk_loggers()
        self.reads = 0
        count_secret_reads(patches, self._count_read)
        self._client = boto3.client("secretsmanager", region_name="us-east-1")
        self.arn = self._client.create_secret(Name=f"sw-api-key-{id(self)}", SecretString=value)["ARN"]
        monkeypatch.delenv("SW_API_KEY", raising=False)
        monkeypatch.setenv("SW_API_KEY_SECRET_ARN", self.arn)
        reset_services()  # the next invocation builds the runtime from this environment

    def _count_read(self) -> None:
        self.reads += 1

    def rotate(self, value: str) -> None:
        self._client.put_secret_value(SecretId=self.arn, SecretString=value)


@pytest.fixture
def secret_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``secret_key(value)`` once the stack runs (moto must be active): the key moves from
    SW_API_KEY to a secret named by SW_API_KEY_SECRET_ARN."""
    from aws_lambda_powertools.utilities import parameters

    parameters.clear_caches()
    with ExitStack() as patches:
        yield lambda value: SecretsManagerKey(monkeypatch, patches, value)
    parameters.clear_caches()
