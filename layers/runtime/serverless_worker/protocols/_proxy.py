"""Which proxy, if any, a transport may use: the plain-HTTP rule applied to the proxy too.

The proxy comes from the environment (``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY``,
read by ``_http._environment_settings``). Two rules are laid on top of it:

- A loopback server is never reached through a proxy, whatever ``NO_PROXY`` says: the
  request would leave the machine (the proxy's) only to come back, and for an ``http://``
  sandbox every request, credential included, would cross the proxy hop in clear.
- A proxy spoken to in plain text (``http://``, ``socks*://`` or no scheme, which libcurl
  reads as ``http://``) on a host other than loopback is refused unless
  ``allow_insecure_http`` is set: what crosses that hop is readable by anyone on the
  path. For an ``http://`` server that is every request, the credential included; for an
  ``https://`` server, libcurl tunnels (``CONNECT``), so the key stays inside TLS and only
  the server's host name and the proxy's own credentials (``user:password@``) go in clear.
  The opt-in is the one that allows plain ``http://`` to a server; without it, use an
  ``https://`` proxy, a proxy on loopback, or ``NO_PROXY`` (docs/settings.md).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..loopback import is_loopback_host, is_loopback_url

__all__ = ["checked_proxy"]


def checked_proxy(base_url: str, proxy: str | None, *, allow_insecure_http: bool) -> str | None:
    """The proxy to use for ``base_url``: ``None`` for a loopback server, else ``proxy``
    once it passes the plain-text rule; ConfigurationError (naming the proxy without its
    user info) when it does not."""
    if not proxy or is_loopback_url(base_url):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme == "https" or allow_insecure_http or is_loopback_host(parts.hostname or ""):
        return proxy
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    raise ConfigurationError(
        f"refusing the plain-text proxy {parts.scheme}://{parts.hostname or '?'}{port} from the environment "
        f"(HTTP_PROXY, HTTPS_PROXY or ALL_PROXY) for {urlsplit(base_url).hostname}: use an https:// proxy or "
        "one on loopback, exclude the host with NO_PROXY, or set allow_insecure_http explicitly")
