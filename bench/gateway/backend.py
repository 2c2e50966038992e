"""The bench's backend: a raw ASGI app with fixed OpenAI-shaped answers, as cheap as a server gets,
so what the bench measures is the gateway. ``uvicorn backend:app --loop uvloop --http httptools``."""

from __future__ import annotations

import json
from typing import Any

EMBEDDING = json.dumps(
    {
        "object": "list",
        "model": "bench",
        "data": [{"object": "embedding", "index": 0, "embedding": [round(i / 97, 6) for i in range(96)]}],
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    }
).encode()
CHAT = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello."}}
        ],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }
).encode()
CHUNKS = [
    b"data: "
    + json.dumps(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
        }
    ).encode()
    + b"\n\n"
    for i in range(20)
] + [b"data: [DONE]\n\n"]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path.endswith("/chat/completions") and (b'"stream": true' in body or b'"stream":true' in body):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for chunk in CHUNKS:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    payload = (
        EMBEDDING
        if path.endswith("/embeddings")
        else CHAT
        if path.endswith("/completions")
        else b'{"status":"ok"}'
    )
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
