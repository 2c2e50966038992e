"""llama.cpp embeddings with a pooling, over HTTP: one vector per input from any GGUF.

    python -m agent.engines.llama_embeddings --model PATH --port 9000

llama-cpp-python's own server takes no pooling setting, and a generative GGUF (the demo Gemma) has
none of its own, so its ``/v1/embeddings`` answers a vector per token. This serves the same model
through llama.cpp (``llama_cpp.Llama``) with mean pooling and L2-normalised vectors: ``GET /health``,
``GET /v1/models``, ``POST /v1/embeddings`` (OpenAI's shape, with token usage). One request at a time
(a llama.cpp context is not shared between threads). Needs ``make engines`` (llama-cpp-python).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def make_handler(model: Any, name: str) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok", "model": name})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            if self.path != "/v1/embeddings":
                self._json(404, {"error": {"message": "this engine serves /v1/embeddings only"}})
                return
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                inputs = request.get("input")
                inputs = [inputs] if isinstance(inputs, str) else inputs
                if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) for t in inputs):
                    raise ValueError("input must be a string or a list of strings")
            except ValueError as exc:
                self._json(400, {"error": {"message": str(exc)}})
                return
            with lock:
                vectors, tokens = model.embed(inputs, normalize=True, return_count=True)
            self._json(
                200,
                {
                    "object": "list",
                    "model": name,
                    "data": [
                        {"object": "embedding", "index": i, "embedding": vector}
                        for i, vector in enumerate(vectors)
                    ],
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                },
            )

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.engines.llama_embeddings")
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--context", type=int, default=512)
    args = parser.parse_args(argv)
    import llama_cpp

    model = llama_cpp.Llama(
        model_path=str(args.model),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=args.context,
        n_batch=args.context,
        verbose=False,
    )
    server = ThreadingHTTPServer((args.host, args.port), make_handler(model, args.model.name))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"llama embeddings serving {args.model.name} on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
