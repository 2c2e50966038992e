"""Bounds on a JSON body checked on its bytes, before any parser recurses into it.

Python's parsers (json, msgspec, DRF's) recurse once per level of nesting: a body nested a few thousand
deep is a ``RecursionError``, a 500 with a traceback. A NUL character (``\\u0000``) is valid JSON that
PostgreSQL's text cannot store and that C and C++ engines read as the end of a string. ``scan_json``
looks for both on the bytes with a few passes in C (a ``memchr`` for a backslash, two ``count`` of
brackets: a fraction of a microsecond for an ordinary body); the exact checks run only when those
cannot rule a problem out.
"""

from __future__ import annotations

import json
import re
from typing import Any

# Deeper than any request the platform takes: an image in an OpenAI chat message is 6 levels deep, a
# tool's JSON Schema a few more per level of the schema. Python's own recursion limit is 1,000.
MAX_JSON_DEPTH = 64
TOO_DEEP_MESSAGE = (
    f"The body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels; send a flatter document."
)

_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_EMPTY_CONTAINERS = re.compile(rb"\[\]|\{\}")
_NUL = b"\\u0000"


def scan_json(body: bytes, limit: int = MAX_JSON_DEPTH) -> tuple[bool, bool]:
    """(whether the JSON document ``body`` nests deeper than ``limit``, whether a string or key of it
    holds a NUL character), from the bytes alone.

    1. A NUL is an escape: without a backslash in the body there is none; with one, ``json_has_nul``.
    2. At most ``limit`` brackets in all (strings included): it cannot be deeper. The usual case.
    3. Otherwise find the brackets outside strings (``_brackets_outside_strings``) and remove every empty
       ``[]`` and ``{}`` at once, ``limit`` times: each round removes exactly one level, so anything left
       is deeper than ``limit``. A round that removes nothing means the brackets do not balance: not JSON,
       for the parser to refuse (it stops at its own bound, which the caller turns into the same refusal).
    """
    escapes = body.find(b"\\") >= 0  # (not ``in``: see modelforge/http_protocol.py's _lean_handler)
    nul = escapes and json_has_nul(body)
    if body.count(b"[") + body.count(b"{") <= limit:
        return False, nul
    brackets = _brackets_outside_strings(body, escapes)
    for _ in range(limit):
        if not brackets:
            return False, nul
        shorter = _EMPTY_CONTAINERS.sub(b"", brackets)
        if len(shorter) == len(brackets):
            return False, nul
        brackets = shorter
    return bool(brackets), nul


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON document ``body`` nests objects and arrays deeper than ``limit``."""
    return scan_json(body, limit)[0]


def json_has_nul(body: bytes) -> bool:
    """True when a string (a key or a value) of the JSON document ``body`` holds a NUL character.

    A raw NUL byte is not JSON (the parser refuses it); the escape ``\\u0000`` is. The text ``\\u0000``
    preceded by an escaped backslash (``\\\\u0000`` in the bytes: a backslash, then ``u0000``) is not a NUL,
    so the backslashes before each match are counted: an odd run in all makes it an escape."""
    at = body.find(_NUL)
    while at >= 0:
        start = at
        while start > 0 and body[start - 1] == 0x5C:  # backslashes before this one
            start -= 1
        if (at - start) % 2 == 0:
            return True
        at = body.find(_NUL, at + 1)
    return False


def nul_message(body: bytes) -> str:
    """The refusal for a body ``json_has_nul`` found a NUL in, naming where (``$.messages[0].content``,
    or the object whose key holds it). Only on that path: it parses the body again."""
    try:
        where = _nul_at(json.loads(body), "$")
    except (ValueError, RecursionError):  # a body another parser took but json does not: say no more
        where = None
    return f"{where or 'A string'} contains a NUL character (\\u0000); remove it."


def _nul_at(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, list):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    elif isinstance(value, dict):
        for key in value:
            if "\x00" in key:
                return f"A key of {path}"
        items = ((f"{path}.{key}", item) for key, item in value.items())
    else:
        return None
    for where, item in items:
        found = _nul_at(item, where)
        if found:
            return found
    return None


def _brackets_outside_strings(body: bytes, escapes: bool) -> bytes:
    """The brackets of ``body`` that are not inside a string, in order.

    With ``escapes``, escaped backslashes go first (escapes pair up from the left, so removing ``\\\\``
    pairs leaves every escaped quote as ``\\"``), then escaped quotes. Then only quotes and brackets are
    kept (a small string): every quote opens or closes a string, and what lies between every other pair is
    outside them."""
    if escapes:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = body.translate(None, _NOT_STRUCTURE)
    return b"".join(structure.split(b'"')[0::2])
