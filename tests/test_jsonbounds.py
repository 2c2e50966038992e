"""modelforge.jsonbounds counts nesting and finds NUL characters on the raw bytes exactly as a parser
would see them: brackets and ``\\u0000`` inside strings, escaped quotes and escaped backslashes included."""

from __future__ import annotations

import json
import random
from typing import Any

from modelforge.jsonbounds import MAX_JSON_DEPTH, json_has_nul, json_too_deep, nul_message, scan_json

# Strings made of what confuses a byte-level reader: quotes, backslashes, brackets, NULs, "u0000".
TRICKY = ['"', "\\", '\\"', "[", "]", "{", "}", "\\\\", "a", "\\u0000", '"]', '\\\\"[', "\x00", "u0000"]


def depth(value: Any) -> int:
    if isinstance(value, dict | list):
        children = value.values() if isinstance(value, dict) else value
        return 1 + max((depth(child) for child in children), default=0)
    return 0


def holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, list):
        return any(holds_nul(item) for item in value)
    if isinstance(value, dict):
        return any("\x00" in key or holds_nul(item) for key, item in value.items())
    return False


def document(rng: random.Random, levels: int) -> Any:
    if levels <= 0 or rng.random() < 0.1:
        return "".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 5)))
    width = 1 if rng.random() < 0.85 else 2
    if rng.random() < 0.5:
        return [document(rng, levels - 1) for _ in range(width)]
    return {document(rng, 0): document(rng, levels - 1) for _ in range(width)}


def test_depth_and_nul_agree_with_the_parser_on_3000_tricky_documents():
    rng = random.Random(13)
    for _ in range(3000):
        value = document(rng, rng.randint(1, 80))
        body = json.dumps(value).encode()
        for limit in (3, 10, MAX_JSON_DEPTH):
            assert json_too_deep(body, limit) == (depth(value) > limit), body[:300]
        assert json_has_nul(body) == holds_nul(value), body[:300]
        assert scan_json(body) == (depth(value) > MAX_JSON_DEPTH, holds_nul(value))


def test_the_bound_is_exact_for_arrays_objects_and_both_alternating():
    for opening, closing in ((b"[", b"]"), (b'{"a":', b"}"), (b'[{"a":', b"}]")):
        per_level = 2 if opening == b'[{"a":' else 1
        levels = MAX_JSON_DEPTH // per_level
        at_bound = opening * levels + b"1" + closing * levels
        assert json.loads(at_bound) is not None and not json_too_deep(at_bound)
        one_more = b"[" + at_bound + b"]"
        assert json_too_deep(one_more)
    # Never closed: not counted as depth (not JSON); the parser refuses it, at its own bound.
    assert not json_too_deep(b"[" * 5000)


def test_the_nul_message_names_where():
    assert nul_message(b'{"a": [1, {"b": "x\\u0000"}]}').startswith("$.a[1].b contains a NUL character")
    assert nul_message(b'{"a": {"k\\u0000": 1}}').startswith("A key of $.a contains a NUL character")
    assert nul_message(b'["\\u0000"]').startswith("$[0] contains")
