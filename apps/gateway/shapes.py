"""The OpenAI request shapes the gateway checks before any backend is contacted.

A body the engine cannot take must not reach it: an engine that fails on ``"messages": 5`` answers 5xx,
and five of those in a row would bench a healthy backend (docs/DECISIONS.md, 2026-11-30). So the fields
whose type an engine relies on are checked here, as OpenAI's API reference defines them, and anything
else (``tools``, ``response_format``, an engine's own extensions) is the backend's business: skipped by
the decoder, forwarded untouched. A field may always be ``null`` where OpenAI allows it.

One msgspec decode per request does it all in C (typed ``Struct``s with ``Meta`` bounds; unknown fields
are skipped without building objects): measured in-process on the gateway bench's chat body, about
0.2 µs over decoding ``model`` alone, where ``json.loads`` and checks in Python took about 3 µs.
msgspec names the first problem and where it is (``$.messages[0].content``); ``ShapeError`` turns that
into a sentence that names the field and says what it must be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from modelforge.jsonbounds import MAX_JSON_DEPTH

# Above the context window of any engine served today (the largest, 10 M tokens), far below where an
# engine's 32-bit token arithmetic overflows.
MAX_TOKENS = 2**24
# OpenAI's own bounds: completions per request, inputs per embeddings request, top log-probabilities.
MAX_CHOICES = 128
MAX_INPUTS = 2048
MAX_TOP_LOGPROBS = 20
TOKEN_ID_MAX = 2**31 - 1

MODEL_MESSAGE = 'The body must be a JSON object with "model": "<capability>", e.g. "rag.embedding@1".'

_Tokens = Annotated[int, Meta(ge=1, le=MAX_TOKENS)]
_Choices = Annotated[int, Meta(ge=1, le=MAX_CHOICES)]
_Temperature = Annotated[float, Meta(ge=0, le=2)]
_Probability = Annotated[float, Meta(ge=0, le=1)]
_Penalty = Annotated[float, Meta(ge=-2, le=2)]
_Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
_Stop = str | list[str]
_TokenId = Annotated[int, Meta(ge=0, le=TOKEN_ID_MAX)]
_TokenIds = Annotated[list[_TokenId], Meta(min_length=1)]


class _ContentPart(Struct):
    """One part of a message's content (text, image_url, input_audio, ...): an object with a type."""

    type: str
    text: Any = None  # a text part's text (prefix routing reads it; the engine judges it)


class _Message(Struct):
    """A chat message: a role, and content that is text, a list of parts, or null (a tool call)."""

    role: Annotated[str, Meta(min_length=1)]
    content: str | list[_ContentPart] | None = None


class _StreamOptions(Struct):
    include_usage: bool | None = None


class ChatCompletion(Struct):
    """``POST /v1/chat/completions``."""

    model: str
    messages: Annotated[list[_Message], Meta(min_length=1)]
    max_tokens: _Tokens | None = None
    max_completion_tokens: _Tokens | None = None
    n: _Choices | None = None
    temperature: _Temperature | None = None
    top_p: _Probability | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | UnsetType | None = UNSET  # left out, or null (apps/gateway/usage.py)
    stop: _Stop | None = None
    seed: _Seed | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    user: str | None = None


class Completion(Struct):
    """``POST /v1/completions`` (the legacy text completions)."""

    model: str
    # A string, a list of strings, a list of token ids or a list of lists of them (one kind per list:
    # checked after decoding, msgspec's unions cannot say it).
    prompt: str | Annotated[list[str | _TokenId | _TokenIds], Meta(min_length=1, max_length=MAX_INPUTS)]
    max_tokens: _Tokens | None = None
    n: _Choices | None = None
    temperature: _Temperature | None = None
    top_p: _Probability | None = None
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | UnsetType | None = UNSET  # left out, or null (apps/gateway/usage.py)
    stop: _Stop | None = None
    seed: _Seed | None = None
    echo: bool | None = None
    suffix: str | None = None
    user: str | None = None


_Text = Annotated[str, Meta(min_length=1)]


class Embeddings(Struct):
    """``POST /v1/embeddings``."""

    model: str
    input: _Text | Annotated[list[_Text | _TokenId | _TokenIds], Meta(min_length=1, max_length=MAX_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Meta(ge=1, le=65536)] | None = None
    user: str | None = None


_INPUTS = (
    "a string, a list of strings, a list of token ids (whole numbers from 0) or a list of lists of "
    f"token ids, with 1 to {MAX_INPUTS} items of one kind"
)
# What each checked field must be, in the words of the refusal.
RULES = {
    "messages": (
        "messages must be a non-empty list of message objects, each with a string role and a content "
        "that is a string, null or a list of content parts (objects with a string type)"
    ),
    "max_tokens": f"max_tokens must be a whole number from 1 to {MAX_TOKENS}, or null",
    "max_completion_tokens": f"max_completion_tokens must be a whole number from 1 to {MAX_TOKENS}, or null",
    "n": f"n must be a whole number from 1 to {MAX_CHOICES}, or null",
    "temperature": "temperature must be a number from 0 to 2, or null",
    "top_p": "top_p must be a number from 0 to 1, or null",
    "presence_penalty": "presence_penalty must be a number from -2 to 2, or null",
    "frequency_penalty": "frequency_penalty must be a number from -2 to 2, or null",
    "stream": "stream must be true, false or null",
    "stream_options": 'stream_options must be an object (with "include_usage": true or false) or null',
    "stop": "stop must be a string, a list of strings, or null",
    "seed": "seed must be a whole number that fits in 64 bits, or null",
    "logprobs": "logprobs must be true, false or null",
    "top_logprobs": f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}, or null",
    "user": "user must be a string or null",
    "echo": "echo must be true, false or null",
    "suffix": "suffix must be a string or null",
    "prompt": f"prompt must be {_INPUTS}",
    "input": f"input must be {_INPUTS}; a string may not be empty",
    "encoding_format": 'encoding_format must be "float", "base64" or null',
    "dimensions": "dimensions must be a whole number from 1 to 65536, or null",
}

_DECODERS: dict[str, Callable[[bytes], ChatCompletion | Completion | Embeddings]] = {
    "/v1/chat/completions": msgspec.json.Decoder(ChatCompletion).decode,
    "/v1/completions": msgspec.json.Decoder(Completion).decode,
    "/v1/embeddings": msgspec.json.Decoder(Embeddings).decode,
}


class ShapeError(Exception):
    """The body is JSON but not the shape the route takes; the message names the field."""


class TooDeep(Exception):
    """The body nests deeper than the parser goes (see modelforge/jsonbounds.py)."""


def checked(path: str, body: bytes) -> ChatCompletion | Completion | Embeddings:
    """The decoded request for ``path`` (one of the gateway's POST routes), or ``ShapeError``;
    ``msgspec.DecodeError`` when the body is not JSON at all."""
    try:
        request = _DECODERS[path](body)
    except msgspec.ValidationError as exc:
        raise ShapeError(_describe(str(exc))) from None
    except RecursionError:
        # scan_json keeps bodies this deep out, except brackets that never close (not JSON, not counted):
        # msgspec recurses into those up to Python's own limit.
        raise TooDeep(f"deeper than {MAX_JSON_DEPTH}") from None
    # The one rule msgspec's types cannot state: a list of inputs holds one kind of item.
    if isinstance(request, Embeddings):
        _one_kind("input", request.input)
    elif isinstance(request, Completion):
        _one_kind("prompt", request.prompt)
    return request


def _one_kind(field: str, value: object) -> None:
    if type(value) is list and len(value) > 1 and len(set(map(type, value))) > 1:
        raise ShapeError(f"{RULES[field]}: this list mixes kinds of items.")


def _describe(problem: str) -> str:
    """msgspec's ``Expected `int` >= 1 - at `$.max_tokens``` as the field's rule and where it failed."""
    detail, _, where = problem.partition(" - at `")
    where = where.rstrip("`")
    if where:
        field = where[2:].split(".", 1)[0].split("[", 1)[0]
    elif "missing required field `" in detail:
        field = detail.split("`")[1]
        return MODEL_MESSAGE if field == "model" else f"{field} is missing: {RULES[field]}."
    else:
        return MODEL_MESSAGE  # the body is not a JSON object
    if field == "model":
        return MODEL_MESSAGE
    rule = RULES.get(field, f"{field} is not valid")
    return f"{rule}: at {where}, {detail[0].lower()}{detail[1:]}."
