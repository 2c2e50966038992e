"""The client's address behind the proxies ``MODELFORGE_TRUSTED_PROXIES`` lists, and no others.

Anyone can send ``X-Forwarded-For``. Believed from any peer (uvicorn's default believed it from
127.0.0.1), a process on the machine chose which address the authentication-failure block counted
(modelforge.auththrottle) and the log-in lockout (django-axes) locked: each guess from a new made-up
address. So the web server's own reading is off (modelforge.gunicorn_worker) and this module is the one
reading, for Django and the lean endpoints alike:

1. A request whose peer is not a trusted proxy is from its peer; its forwarded headers are ignored.
2. From a trusted proxy, ``X-Forwarded-For`` is read from the right: each proxy appends the address it
   was called from, so the first address that is not itself a trusted proxy is the client. If every one
   is, the leftmost is. A hop that is not an address ends the walk at the last trusted one.
3. From a trusted proxy, the last ``X-Forwarded-Proto`` value (``http`` or ``https``) is the scheme, so
   that Django sees a request the proxy received over TLS as secure.

The ASGI scope is rewritten in place (``client``, ``scheme``): ``REMOTE_ADDR`` and ``request.is_secure()``
follow, and so does everything that reads them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class TrustedProxies:
    """The networks whose forwarded headers are believed."""

    def __init__(self, networks: Iterable[Network]) -> None:
        self.networks = tuple(networks)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        # A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d; the list names it as a.b.c.d.
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return any(ip in network or (mapped is not None and mapped in network) for network in self.networks)

    def client(self, peer: str, forwarded_for: list[str]) -> str:
        """The client's address: ``peer``, or what the trusted proxies say (steps 1 and 2 above)."""
        if not self.trusts(peer):
            return peer
        current = peer
        hops = [hop.strip() for value in forwarded_for for hop in value.split(",")]
        for hop in reversed(hops):
            try:
                address = str(ipaddress.ip_address(hop))
            except ValueError:
                break
            if not self.trusts(address):
                return address
            current = address
        return current

    def resolve(self, scope: dict[str, Any]) -> None:
        """Rewrite ``scope``'s ``client`` and ``scheme`` when its peer is a trusted proxy."""
        peer = scope.get("client")
        if not peer or not self.trusts(peer[0]):
            return
        forwarded_for: list[str] = []
        proto = None
        for name, value in scope.get("headers", ()):
            if name == b"x-forwarded-for":
                forwarded_for.append(value.decode("latin-1"))
            elif name == b"x-forwarded-proto":
                proto = value.decode("latin-1").rsplit(",", 1)[-1].strip().lower()
        if forwarded_for:
            scope["client"] = (self.client(peer[0], forwarded_for), 0)
        if proto in ("http", "https") and scope.get("type") == "http":
            scope["scheme"] = proto


_current: TrustedProxies | None = None


def trusted() -> TrustedProxies:
    """The configured proxies (``settings.TRUSTED_PROXIES``), read once per process."""
    global _current
    if _current is None:
        from django.conf import settings

        _current = TrustedProxies(settings.TRUSTED_PROXIES)
    return _current
