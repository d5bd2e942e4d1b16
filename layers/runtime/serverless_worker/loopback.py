"""Which hosts are loopback: the only ones plain ``http://`` may reach (sandboxes, test servers).

``localhost``, 127.0.0.0/8 and ``::1``. An IPv4-mapped IPv6 literal such as
``[::ffff:127.0.0.1]`` is not: Python 3.13 counts it as loopback where 3.11 did not, and
whether it reaches the loopback interface depends on the socket's ``IPV6_V6ONLY``, so the
answer here does not change with the interpreter; nobody needs to write loopback that way.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

__all__ = ["is_loopback_host", "is_loopback_url"]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address literal, without brackets) is loopback."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return False
    return address.is_loopback


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is loopback."""
    return is_loopback_host(urlsplit(url).hostname or "")
