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

The runtime's code calls boto3 through small typed views (:class:`LambdaClient`,
:class:`StepFunctionsClient`): each names only the operations the runtime makes, so mypy
checks those calls without the boto3 type stubs, which the Lambda runtime does not ship.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from .errors import ConfigurationError

if TYPE_CHECKING:
    import boto3
    import botocore.config
    import botocore.session

__all__ = ["LambdaClient", "LazyClient", "StepFunctionsClient", "aws_setup_error", "build_all_clients",
           "check_region", "lambda_client", "renew_clients", "shared_session", "stepfunctions_client"]

# botocore sessions are not thread-safe: one lock around creating the session and clients.
_LOCK = threading.RLock()
# Every LazyClient, so a SnapStart restore can make each forget its client (runtime/snapstart.py).
_CLIENTS: weakref.WeakSet[LazyClient] = weakref.WeakSet()
# The botocore session under boto3's default session, kept so a renewed session can reuse
# its loaded service models (data only: no credentials, no connections).
_BOTOCORE: botocore.session.Session | None = None

# AWS error codes that mean "the stack or the account is set up wrong", not "try again".
_MISSING = frozenset({"ResourceNotFoundException", "StateMachineDoesNotExist", "QueueDoesNotExist",
                      "AWS.SimpleQueueService.NonExistentQueue", "ParameterNotFound"})
_DENIED = frozenset({"AccessDenied", "AccessDeniedException", "UnrecognizedClientException",
                     "InvalidClientTokenId", "ExpiredToken", "ExpiredTokenException",
                     "InvalidSignatureException", "SignatureDoesNotMatch", "AuthFailure",
                     "MissingAuthenticationToken"})


def shared_session() -> boto3.Session:
    """boto3's default session (created once): the one session every runtime client uses."""
    import boto3

    global _BOTOCORE
    with _LOCK:
        if boto3.DEFAULT_SESSION is None:
            import botocore.session

            loaded = _BOTOCORE.get_component("data_loader") if _BOTOCORE is not None else None
            _BOTOCORE = botocore.session.get_session()
            if loaded is not None:
                _BOTOCORE.register_component("data_loader", loaded)
                # Building the loader read the profile and refused a missing one; read it here instead.
                _BOTOCORE.get_scoped_config()
            from . import awscall_log

            if awscall_log.enabled():  # the IAM proof's recorder (test-only; awscall_log.py)
                awscall_log.install(_BOTOCORE)
            boto3.setup_default_session(botocore_session=_BOTOCORE)
        session: boto3.Session = boto3.DEFAULT_SESSION
        return session


def renew_clients() -> None:
    """Forget the shared session (so credentials are resolved again) and every client built
    on it, closing their connection pools; each LazyClient builds anew at its next call.

    For environments restored from one SnapStart snapshot, which must not share sockets or
    credentials. Service models already loaded are kept: they are data, and reloading them
    is what a cold start spends its time on.
    """
    import boto3

    with _LOCK:
        for lazy in list(_CLIENTS):
            lazy.forget()
        boto3.DEFAULT_SESSION = None


def build_all_clients() -> int:
    """Build every LazyClient that exists (no AWS call is made), so a snapshot holds the
    service models they load. Returns how many were built."""
    clients = list(_CLIENTS)
    for lazy in clients:
        lazy.client  # noqa: B018 - building is the point
    return len(clients)


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

    def __init__(self, service: str, *, config: botocore.config.Config | None = None) -> None:
        self._service = service
        self._config = config
        self._client: Any = None
        _CLIENTS.add(self)

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

    def forget(self) -> None:
        """Drop the real client and close its connections; the next call builds a new one."""
        with _LOCK:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __getattr__(self, name: str) -> Any:
        # Only names not found on the proxy get here; dunders (copy, pickle) never build a client.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.client, name)

    def __repr__(self) -> str:
        return f"LazyClient({self._service!r}, built={self.built})"


class LambdaClient(Protocol):
    """The Lambda operations the runtime calls (the dispatcher's async ``Invoke``)."""

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> Mapping[str, Any]: ...


class StepFunctionsClient(Protocol):
    """The Step Functions operations the runtime calls: starting an execution, and ending
    or keeping alive a callback task."""

    def start_execution(self, *, stateMachineArn: str, name: str, input: str) -> Mapping[str, Any]: ...

    def send_task_failure(self, *, taskToken: str, error: str, cause: str) -> Mapping[str, Any]: ...

    def send_task_heartbeat(self, *, taskToken: str) -> Mapping[str, Any]: ...


def lambda_client() -> LambdaClient:
    """A lazily built Lambda client. The proxy forwards every call to the real client, so
    it is typed as the operations it forwards."""
    return cast(LambdaClient, LazyClient("lambda"))


def stepfunctions_client() -> StepFunctionsClient:
    """A lazily built Step Functions client (see :func:`lambda_client`)."""
    return cast(StepFunctionsClient, LazyClient("stepfunctions"))


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
