"""What every HTTP protocol client shares: its credential, its transport, its retry
policy, its call counts and a repr that never shows the credential.

Each client decides what its endpoints mean (docs/protocols.md); how a call is sent,
counted and retried, and how the credential is held, is decided once, here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, TypedDict

from pydantic import SecretStr

from .. import logsafety
from ._http import HttpTransport, RetryPolicy, display_url, header_credential, retry_call
from .base import WorkerProtocol

__all__ = ["DEFAULT_RETRY", "HttpOptions", "HttpProtocolClient"]

DEFAULT_RETRY = RetryPolicy()
_MASK = "SecretStr('**********')"


class HttpOptions(TypedDict, total=False):
    """The transport settings every client takes as keywords, passed through to
    :class:`HttpProtocolClient` unchanged (its signature holds the defaults)."""

    retry: RetryPolicy
    connect_timeout: float
    read_timeout: float
    allow_insecure_http: bool
    pool_maxsize: int


class HttpProtocolClient(WorkerProtocol):
    """A :class:`WorkerProtocol` over one pooled :class:`HttpTransport`.

    The credential (an API key or a bearer token) is held as a SecretStr and revealed
    only by :meth:`_secret`, when a request is built. ``credential_field`` names it in
    the repr, where it is always masked; ``credential_label`` names it in the error a
    credential that cannot be a header value raises.
    """

    credential_field: ClassVar[str] = "api_key"
    credential_label: ClassVar[str] = "API key"

    def __init__(
        self,
        base_url: str,
        credential: SecretStr | str,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        connect_timeout: float = 3.05,
        read_timeout: float = 10.0,
        allow_insecure_http: bool = False,
        pool_maxsize: int = 64,
    ) -> None:
        self._credential = header_credential(credential, self.credential_label)
        logsafety.register_secret(self._credential.get_secret_value())  # out of third-party logs too
        self._retry = retry
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._transport = HttpTransport(base_url, connect_timeout=connect_timeout, read_timeout=read_timeout,
                                        pool_maxsize=pool_maxsize, allow_insecure_http=allow_insecure_http)
        self._where = display_url(self._transport.base_url)  # for retry logs: worked out once, not per report

    @property
    def base_url(self) -> str:
        return self._transport.base_url

    @property
    def calls(self) -> Mapping[str, int]:
        """HTTP calls made so far, per endpoint label."""
        return self._transport.calls

    def _secret(self) -> str:
        """The credential in clear, for the one request being built (never stored elsewhere)."""
        return self._credential.get_secret_value()

    def _retrying[T](self, call: Callable[[int], T]) -> T:
        """``call(attempt_number)`` under this client's retry policy (reporting calls only)."""
        return retry_call(call, self._retry, where=self._where)

    def _repr_fields(self) -> Mapping[str, object]:
        """What the repr shows between the base URL and the masked credential."""
        return {}

    def __repr__(self) -> str:
        shown = [f"base_url={self.base_url!r}", *(f"{name}={value!r}" for name, value in self._repr_fields().items()),
                 f"{self.credential_field}={_MASK}"]
        return f"{type(self).__name__}({', '.join(shown)})"

    def close(self) -> None:
        """Release the pooled HTTP session."""
        self._transport.close()
