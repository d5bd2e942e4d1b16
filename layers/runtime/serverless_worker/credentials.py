"""Where the API key comes from: the environment locally, Secrets Manager or SSM in AWS.

Powertools Parameters does the reading and caches each value for five minutes, so
every Lambda invocation does not call AWS. ``refresh=True`` bypasses the cache: the
runtime asks for it once when the job server rejects the key (it may have been
rotated). Powertools (and with it boto3) is imported only here, only when needed, and
its provider gets the runtime's shared boto3 session (``awsclients``): on a session of
its own it would load botocore's data a second time in a cold container.

A secret may hold the bare key or a JSON object with an ``api_key`` (or ``apiKey``)
field, the shape the Secrets Manager console produces for key/value secrets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from pydantic import SecretStr

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["CACHE_SECONDS", "resolve_api_key"]

CACHE_SECONDS = 300
_JSON_FIELDS = ("api_key", "apiKey", "API_KEY")


def resolve_api_key(settings: Settings, *, refresh: bool = False) -> SecretStr:
    """The API key to send, as a SecretStr. Raises ConfigurationError when none is configured
    or the store cannot be read; the message names the source, never the value."""
    if settings.api_key is not None:
        return settings.api_key
    if settings.api_key_secret_arn:
        source = f"Secrets Manager secret {settings.api_key_secret_arn}"
        raw = _read(source, "secrets", lambda p: p.get_secret(settings.api_key_secret_arn, max_age=CACHE_SECONDS,
                                                                 force_fetch=refresh))
    elif settings.api_key_parameter:
        source = f"SSM parameter {settings.api_key_parameter}"
        raw = _read(source, "ssm", lambda p: p.get_parameter(settings.api_key_parameter, decrypt=True,
                                                               max_age=CACHE_SECONDS, force_fetch=refresh))
    else:
        raise ConfigurationError("no API key configured: set SW_API_KEY (local use), "
                                 "SW_API_KEY_SECRET_ARN or SW_API_KEY_PARAMETER")
    return SecretStr(_extract(raw, source))


def _read(source: str, kind: str, fetch: Callable[[ModuleType], object]) -> object:
    """``fetch(parameters)`` (the Powertools Parameters module), its errors as ConfigurationError."""
    from aws_lambda_powertools.utilities import parameters

    from . import logsafety  # noqa: F401  (botocore must not log the secret's value)

    try:
        _share_session(parameters, kind)
        return fetch(parameters)
    except Exception as err:
        # Powertools wraps AWS errors (not found, access denied); they carry names, not values.
        raise ConfigurationError(f"could not read the API key from {source}: {type(err).__name__}: {err}") \
            from err


def _share_session(parameters: ModuleType, kind: str) -> None:
    """Register Powertools' default ``kind`` provider ("secrets" or "ssm") on the shared
    session, unless one exists. ``parameters.clear_caches()`` still drops it, as it would
    drop the provider Powertools builds."""
    from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS

    from .awsclients import shared_session

    if kind not in DEFAULT_PROVIDERS:
        provider = parameters.SecretsProvider if kind == "secrets" else parameters.SSMProvider
        DEFAULT_PROVIDERS[kind] = provider(boto3_session=shared_session())


def _extract(raw: object, source: str) -> str:
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigurationError(f"the API key in {source} is not UTF-8 text") from None
    if not isinstance(raw, str):
        raise ConfigurationError(f"the API key in {source} is not text")
    text = raw.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            for name in _JSON_FIELDS:
                if isinstance(data.get(name), str):
                    text = data[name].strip()
                    break
            else:
                raise ConfigurationError(
                    f"the secret {source} is a JSON object without an api_key field")
    if not text:
        raise ConfigurationError(f"the API key in {source} is empty")
    return text
