"""boto3 clients for the runtime: one shared Session, each client built on first use.

Building a botocore client costs a cold Lambda container tens of milliseconds (the
service model, the endpoint rules), and a container does not use every client: the
executor never starts an execution, and the key is read from Secrets Manager only when
it is not in the environment. So a :class:`LazyClient` stands in for a client until its
first call. Every client is built on boto3's default session (the one ``boto3.client``
uses), so the state store, the dispatcher and Powertools Parameters share botocore's
loaded data and one credential chain instead of a Session each.

A client that cannot be built because AWS is set up wrong (no region, an unusable
profile) raises one :class:`ConfigurationError` saying what to fix, from the call that
needed the client: :func:`aws_setup_error` is the one translation, shared with the
Lambda entry points.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .errors import ConfigurationError

__all__ = ["LazyClient", "aws_setup_error", "check_region", "shared_session"]

# botocore sessions are not thread-safe: one lock around creating the session and clients.
_LOCK = threading.RLock()

# AWS error codes that mean "the stack or the account is set up wrong", not "try again".
_MISSING = frozenset({"ResourceNotFoundException", "StateMachineDoesNotExist", "QueueDoesNotExist",
                      "AWS.SimpleQueueService.NonExistentQueue", "ParameterNotFound"})
_DENIED = frozenset({"AccessDenied", "AccessDeniedException", "UnrecognizedClientException",
                     "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
                     "InvalidSignatureException", "SignatureDoesNotMatch", "AuthFailure",
                     "MissingAuthenticationToken"})


def shared_session() -> Any:
    """boto3's default session (created once): the one session every runtime client uses."""
    import boto3

    with _LOCK:
        if boto3.DEFAULT_SESSION is None:
            boto3.setup_default_session()
        return boto3.DEFAULT_SESSION


def check_region() -> None:
    """Raise the ConfigurationError now that building any client would raise for want of a
    region (or because the profile does not exist): the runtime is built without clients,
    and the scheduler would otherwise meet it in a tick, which it ends quietly."""
    if os.environ.get("AWS_DEFAULT_REGION") and not os.environ.get("AWS_PROFILE"):
        return  # botocore's first place for the region, always set in Lambda: build no session yet
    from botocore.exceptions import NoRegionError

    try:
        region = shared_session().region_name
    except Exception as err:
        clear = aws_setup_error(err)
        if clear is None:
            raise
        raise clear from err
    if not region:
        missing = NoRegionError()
        raise aws_setup_error(missing) or missing from missing


class LazyClient:
    """A boto3 client built on the shared session at its first use, then reused.

    >>> dynamodb = LazyClient("dynamodb")   # nothing built yet
    >>> # dynamodb.get_item(...)           # builds the client, then calls it
    """

    def __init__(self, service: str, *, config: Any = None) -> None:
        self._service = service
        self._config = config
        self._client: Any = None

    @property
    def built(self) -> bool:
        """Whether the real client exists yet."""
        return self._client is not None

    @property
    def client(self) -> Any:
        """The real client, built now if needed (AWS setup errors as ConfigurationError)."""
        if self._client is None:
            with _LOCK:
                if self._client is None:
                    try:
                        self._client = shared_session().client(self._service, config=self._config)
                    except Exception as err:
                        clear = aws_setup_error(err)
                        if clear is None:
                            raise
                        raise clear from err
        return self._client

    def __getattr__(self, name: str) -> Any:
        # Only names not found on the proxy get here; dunders (copy, pickle) never build a client.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.client, name)

    def __repr__(self) -> str:
        return f"LazyClient({self._service!r}, built={self.built})"


def aws_setup_error(err: BaseException) -> ConfigurationError | None:
    """The ConfigurationError for a botocore error that means AWS is set up wrong, else None."""
    from botocore import exceptions as bc

    if isinstance(err, bc.NoRegionError):
        return ConfigurationError("no AWS region configured: set AWS_DEFAULT_REGION or a profile's region")
    if isinstance(err, bc.NoCredentialsError | bc.PartialCredentialsError | bc.CredentialRetrievalError
                  | bc.ProfileNotFound):
        return ConfigurationError(f"no usable AWS credentials ({type(err).__name__}: {err}); configure "
                                  "AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or use a role")
    if isinstance(err, bc.EndpointConnectionError | bc.ConnectTimeoutError):
        url = getattr(err, "kwargs", {}).get("endpoint_url", "")
        name = type(err).__name__
        return ConfigurationError(f"cannot reach the AWS endpoint {url or '(unknown)'} ({name}); "
                                  "check the network, AWS_DEFAULT_REGION and AWS_ENDPOINT_URL")
    if isinstance(err, bc.ClientError):
        error = err.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        operation = getattr(err, "operation_name", "") or "the call"
        if code in _MISSING:
            return ConfigurationError(
                f"AWS resource not found ({code} on {operation}: {message}); check SW_TABLE_NAME, "
                "SW_EXECUTOR_FUNCTION_NAME and SW_STATE_MACHINE_ARN, or deploy the stack")
        if code in _DENIED:
            return ConfigurationError(f"AWS refused the credentials or permissions ({code} on {operation}: "
                                      f"{message})")
    return None
