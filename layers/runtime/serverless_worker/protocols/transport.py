"""The HTTP transport as the rest of the package may use it: what the doctor, the local
runner's first contact and SnapStart's restore hook need, without reaching into the
protocols' private modules (``_http``, ``_session``), whose shape may change."""

from __future__ import annotations

from ._http import HttpResponse, HttpTransport, RetryPolicy, display_url, renew_transports, retry_call
from ._session import TransportError, open_connections

__all__ = ["HttpResponse", "HttpTransport", "RetryPolicy", "TransportError", "display_url", "open_connections",
           "renew_transports", "retry_call"]
