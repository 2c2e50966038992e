"""Every route Django answers, enumerated from the URL resolver, for tests that hold of all of them.

``routes()`` walks ``get_resolver().url_patterns`` recursively and fills each path converter or regex
group with a value it accepts (an id need not exist: authentication is judged before any lookup), so a
route added by any app is covered by tests/test_surfaces.py with no edit there. The lean ASGI endpoints
(the heartbeat fast path, the ``/v1/`` gateway, the artifact store for agents) are not Django routes and
are checked separately.

1. ``api_routes()``: under ``/api/v1/``, with the HTTP methods the view answers.
2. ``dashboard_routes()``: the operator console's pages and form posts.
3. ``PUBLIC`` and ``OWN_CREDENTIALS`` name, with the reason, the routes that are not refused like the
   rest; ``assert_refused_without_key`` and ``assert_sends_to_login`` are the two standard refusals."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import resolve_url
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.urls.resolvers import RegexPattern, RoutePattern

ENVELOPE_KEYS = {"code", "message", "correlation_id"}
API_PREFIX = "/api/v1/"
ADMIN_PREFIX = "/admin/"
# Methods a view answers whatever it serves; refusing them is DRF's job and is not what is checked here.
NEVER_CHECKED = frozenset({"options", "head", "trace"})
# Values tried, in order, for a path parameter: the first that its converter or regex accepts is used. A
# regex group (DRF's router: ``[^/.]+``) is most likely an id; a ``str`` converter most likely a word.
REGEX_SAMPLES = ("1", "00000000-0000-4000-8000-000000000001", "sample")
CONVERTER_SAMPLES = ("sample", *REGEX_SAMPLES[:2])

# Answered without any credential, by design (the reason is the value).
PUBLIC: dict[str, str] = {
    "healthz": "the liveness probe (modelforge.health)",
    "readyz": "the readiness probe (modelforge.health)",
    "dashboard:login": "the log-in page itself",
    "dashboard:logout": "logging out without a session has nothing to end; it goes to the log-in page",
}
# Guarded by a credential other than the operator's; tests/test_surfaces.py asserts each one's refusal.
OWN_CREDENTIALS: dict[str, str] = {
    "api:agent-enroll": "an agent's single-use enrollment token, in the body",
    "api:docs": "the API browser: a browser without a session goes to the log-in page",
    "metrics": "the operator key or a staff session, answered in Prometheus's format",
    "clusters:playground-credential": "a staff session, answered as the JSON envelope (the page fetches it)",
}


@dataclass(frozen=True)
class Route:
    """One URL pattern with its parameters filled in: where to send a request, and what answers it."""

    name: str
    url: str
    pattern: str
    callback: Callable[..., Any]

    @property
    def methods(self) -> tuple[str, ...]:
        """The HTTP methods the view serves (lower case); for a plain function view, GET and POST."""
        actions = getattr(self.callback, "actions", None)
        if actions:
            return tuple(sorted(set(actions) - NEVER_CHECKED))
        view_class = getattr(self.callback, "cls", None) or getattr(self.callback, "view_class", None)
        if view_class is None:
            return ("get", "post")
        named = getattr(view_class, "http_method_names", ())
        return tuple(m for m in named if m not in NEVER_CHECKED and hasattr(view_class, m))

    def __str__(self) -> str:
        return f"{self.name} {self.url}"


def _sample(accepts: Callable[[str], bool], samples: tuple[str, ...]) -> str:
    for value in samples:
        if accepts(value):
            return value
    raise ValueError("no sample value fits")


def _converter_accepts(converter: Any) -> Callable[[str], bool]:
    def accepts(value: str) -> bool:
        if not re.fullmatch(converter.regex, value):
            return False
        try:
            converter.to_python(value)
        except ValueError:
            return False
        return True

    return accepts


def _fill_route(pattern: RoutePattern) -> str:
    text = str(pattern)
    converters = pattern.converters
    return re.sub(
        r"<(?:\w+:)?(\w+)>",
        lambda m: _sample(_converter_accepts(converters[m.group(1)]), CONVERTER_SAMPLES),
        text,
    )


def _fill_regex(pattern: RegexPattern) -> str:
    text = pattern.regex.pattern.removeprefix("^").removesuffix("$")

    def fill(match: re.Match[str]) -> str:
        return _sample(lambda value: re.fullmatch(match.group(2), value) is not None, REGEX_SAMPLES)

    text = re.sub(r"\(\?P<(\w+)>([^()]*)\)", fill, text)
    if re.search(r"[\\()\[\]?*+^$|]", text):
        raise ValueError(f"regex route {pattern.regex.pattern!r} is not a plain path once filled")
    return text


def _walk(
    patterns: list[URLPattern | URLResolver], prefix: str, namespace: str
) -> Iterator[tuple[str, str, str, URLPattern]]:
    for entry in patterns:
        piece = entry.pattern
        if isinstance(piece, RoutePattern):
            filled = _fill_route(piece)
        elif isinstance(piece, RegexPattern):
            filled = _fill_regex(piece)
        else:  # i18n_patterns' language prefix: this project has none
            raise AssertionError(f"{piece!r}: teach tests/surfaces.py this kind of pattern")
        if (prefix + filled).startswith(ADMIN_PREFIX):
            continue
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _walk(entry.url_patterns, prefix + filled, inner)
        else:
            yield f"{namespace}{entry.name or ''}", prefix + filled, str(piece), entry


def routes() -> list[Route]:
    """Every route but the Django admin's (its own log-in page; tests/test_surfaces.py checks it apart).

    Each filled URL is resolved back: it must reach the very view it was made for, or the filling is
    wrong and the route would be checked by proxy."""
    found = []
    for name, path, pattern, entry in _walk(get_resolver().url_patterns, "/", ""):
        match = resolve(path)
        if match.func is not entry.callback:
            raise AssertionError(f"{path} (made for {name}) resolves to {match.view_name}")
        found.append(Route(name=name, url=path, pattern=pattern, callback=entry.callback))
    return found


def api_routes() -> list[Route]:
    """The operator API: every route under /api/v1/ not named in PUBLIC or OWN_CREDENTIALS."""
    return [
        r for r in routes() if r.url.startswith(API_PREFIX) and r.name not in {**PUBLIC, **OWN_CREDENTIALS}
    ]


def dashboard_routes() -> list[Route]:
    """The console: every route outside /api/v1/ not named in PUBLIC or OWN_CREDENTIALS."""
    excluded = {**PUBLIC, **OWN_CREDENTIALS}
    return [r for r in routes() if not r.url.startswith(API_PREFIX) and r.name not in excluded]


def envelope(response: HttpResponse, status: int, code: str) -> dict[str, str]:
    """The error envelope, exactly: the status, the three keys, the code, the header's correlation id."""
    assert response.status_code == status, (response.status_code, response.content[:300])
    body = json.loads(response.content)
    assert set(body) == ENVELOPE_KEYS, body
    assert body["code"] == code, body
    assert body["message"] and body["correlation_id"] == response["X-Correlation-ID"], body
    return body


def assert_refused_without_key(response: HttpResponse) -> None:
    """401 NOT_AUTHENTICATED in the envelope, naming the Bearer scheme to use."""
    envelope(response, 401, "NOT_AUTHENTICATED")
    assert response["WWW-Authenticate"].startswith("Bearer "), response.get("WWW-Authenticate")


def login_location(next_url: str) -> str:
    return f"{resolve_url(settings.LOGIN_URL)}?next={quote(next_url)}"


def assert_sends_to_login(response: HttpResponse, url: str) -> None:
    """A redirect to the log-in page that comes back to ``url`` once logged in."""
    assert response.status_code == 302, (url, response.status_code)
    assert response["Location"] == login_location(url), (url, response["Location"])
