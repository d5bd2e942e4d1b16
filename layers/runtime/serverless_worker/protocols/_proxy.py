"""Which proxy, if any, a transport may use: the plain-HTTP rule applied to the proxy too.

The proxy comes from the environment (``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY``,
read by ``_http._environment_settings``). Two rules are laid on top of it:

- A loopback server is never reached through a proxy, whatever ``NO_PROXY`` says: the
  request would leave the machine (the proxy's) only to come back, and for an ``http://``
  sandbox every request, credential included, would cross the proxy hop in clear.
- A proxy spoken to in plain text (``http://``, ``socks*://`` or no scheme, which is
  read as ``http://``) on a host other than loopback must not see a secret in clear
  unless ``allow_insecure_http`` is set. For an ``https://`` job server the transport tunnels
  (``CONNECT``), so the key stays inside TLS and only the server's host name crosses the
  hop (as it does in TLS's SNI anyway): the usual corporate ``HTTPS_PROXY=http://proxy:3128``
  is fine. What is refused is the proxy's own ``user:password@``, which would cross in
  clear; an ``http://`` job server off loopback needs the opt-in already (settings), and
  with it the proxy is allowed too. Without the opt-in, use an ``https://`` proxy for a
  proxy that needs credentials, one on loopback, or ``NO_PROXY`` (docs/settings.md).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..loopback import is_loopback_host, is_loopback_url

__all__ = ["checked_proxy"]


def checked_proxy(base_url: str, proxy: str | None, *, allow_insecure_http: bool) -> str | None:
    """The proxy to use for ``base_url``: ``None`` for a loopback server, else ``proxy``
    unless a secret would cross a plain-text hop to it (see the module docstring), which
    is a ConfigurationError naming the proxy without its user info."""
    if not proxy or is_loopback_url(base_url):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    tunnelled = urlsplit(base_url).scheme == "https"  # CONNECT: the key stays inside TLS
    secret_in_clear = parts.username is not None or parts.password is not None or not tunnelled
    if (parts.scheme == "https" or allow_insecure_http or is_loopback_host(parts.hostname or "")
            or not secret_in_clear):
        return proxy
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    raise ConfigurationError(
        f"refusing the plain-text proxy {parts.scheme}://{parts.hostname or '?'}{port} from the environment "
        f"(HTTP_PROXY, HTTPS_PROXY or ALL_PROXY) for {urlsplit(base_url).hostname}: its credentials would "
        "cross to it in clear; use an https:// proxy or one on loopback, exclude the host with NO_PROXY, "
        "or set allow_insecure_http explicitly")
