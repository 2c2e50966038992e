"""Where the control plane calls an agent back: the rule for ``agent_url``, at enrollment and in heartbeats.

The docs say "http(s) with a host and a numeric port", and the agent sends ``http://<advertised host>:<port>``
(agent/settings.py). So: ``http`` or ``https``; a host that is a name (labels of 1-63 letters, digits,
``-`` or ``_``, dot-separated: a container's host name has no dot), an IPv4 address or an IPv6 address in
brackets; a port from 1 to 65535; at most a ``/`` after it. No user name or password, no path, query or
fragment (the control plane appends its own paths), no space, nothing percent-encoded, ASCII only (an
international name in its ``xn--`` form). A name made only of digits and dots must be an IPv4 address:
``999.1.1.1`` is refused, not left for the first call to the agent to fail on.

``AGENT_URL`` is the whole rule: the OpenAPI document states it as the field's pattern, so the schema and
the answer agree (apps/nodes/tests/test_agent_url.py generates URLs from it). ``refusal`` says what is wrong
with a URL it does not match.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

EXAMPLE = "http://gpu-01:8471"

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(\.{_OCTET}){{3}}"
_H = r"[0-9A-Fa-f]{1,4}"
# RFC 4291's text forms without an embedded IPv4 address: eight groups, or fewer with one "::".
_IPV6 = (
    rf"({_H}:){{7}}{_H}|({_H}:){{1,7}}:|({_H}:){{1,6}}:{_H}|({_H}:){{1,5}}(:{_H}){{1,2}}"
    rf"|({_H}:){{1,4}}(:{_H}){{1,3}}|({_H}:){{1,3}}(:{_H}){{1,4}}|({_H}:){{1,2}}(:{_H}){{1,5}}"
    rf"|{_H}:(:{_H}){{1,6}}|:((:{_H}){{1,7}}|:)"
)
_LABEL = r"[A-Za-z0-9_-]{1,63}"
# Only digits and dots, and not an IPv4 address: refused (a resolver would read "10.1" as an address).
_NAME = rf"(?![0-9.]*:){_LABEL}(\.{_LABEL})*"
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
AGENT_URL = rf"^[hH][tT][tT][pP][sS]?://({_IPV4}|{_NAME}|\[({_IPV6})\]):{_PORT}/?$"
_MATCH = re.compile(AGENT_URL)


def refusal(value: str) -> str | None:
    """``None`` for a URL the control plane can call an agent at; otherwise what is wrong with it, for the
    ``VALIDATION_ERROR`` message."""
    if _MATCH.match(value):
        return None
    if any(char.isspace() for char in value):
        return "it contains a space"
    try:
        parts = urlsplit(value)
    except ValueError:  # an unbalanced bracket
        return "its host is not a host name, an IPv4 address or an IPv6 address in brackets"
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return "its scheme must be http or https"
    if "@" in parts.netloc:
        return "it may not hold a user name or password (user@)"
    if parts.path not in ("", "/") or parts.query or parts.fragment or value.endswith(("?", "#")):
        return "it takes no path, query or fragment: the control plane adds its own paths"
    no_port = "it names no port (the agent's MODELFORGE_AGENT_PORT, 8471 unless set)"
    if parts.netloc.endswith("]") or ":" not in parts.netloc:
        return no_port
    host, _, port = parts.netloc.rpartition(":")
    if not host:
        return "it names no host"
    if not port:
        return no_port
    if not re.fullmatch(_PORT, port):
        return "the port must be 1 to 65535, written without leading zeros"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address"
    return "its host is not a host name, an IPv4 address or an IPv6 address in brackets"


def message(value: str) -> str | None:
    """The refusal as the API words it, naming an example."""
    why = refusal(value)
    return None if why is None else f"Enter an http(s) URL with a host and a port, such as {EXAMPLE}: {why}."
