"""A tiny real HTTP engine for tests and demonstrations: OpenAI-shaped answers, no model.

    python -m agent.engines.echo --port 9000 --model NAME

``GET /health``, ``GET /v1/models``, ``POST /v1/embeddings`` (a deterministic unit vector per input,
derived from the model's name and the text: 8 dimensions, or N for a name ending ``-Nd``) and
``POST /v1/chat/completions`` (echoes the last user message, or streams it word by word with
``"stream": true``). An input containing ``__status_NNN__`` is answered with that status, so tests can
make a backend fail on purpose; a streamed answer to a message containing ``__burst__`` comes whole in
one write, head included, as an engine answering from a cache would. ``GET /stats`` says how many
requests it answers now, the most it ever answered at once, and when each of the latest began and
ended (Unix time), so tests can measure the concurrency a backend really saw. With ``--metrics
llamacpp`` (or ``vllm``) it also answers ``GET /metrics`` with that engine's Prometheus gauges
(requests running: the requests it is answering; waiting: 0; vLLM's KV-cache share: 1 % per running
request), so the agent's engine signals can be seen end to end; without the option it has none, like
llama-cpp-python's server. It is what the ``test-echo`` runtime profile launches, so placement, remote
starts, stops and routing can be exercised with a real process and real HTTP on any machine.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import re
import signal
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Between streamed chunks: long enough that a buffering proxy would visibly delay the first one.
STREAM_PAUSE_S = 0.2


def dimensions_of(model: str) -> int:
    """8, or what the model's name ends with: ``minilm-16d`` embeds in 16 dimensions."""
    found = re.search(r"-(\d{1,4})d$", model)
    return int(found.group(1)) if found and int(found.group(1)) > 0 else 8


def vector(text: str, model: str = "echo", dimensions: int = 8) -> list[float]:
    """A unit vector derived from the model's name and the text: each model is a space of its own."""
    raw = hashlib.shake_256(model.encode() + b"\0" + text.encode()).digest(dimensions)
    values = [b / 127.5 - 1.0 for b in raw]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


def _words(messages: list[Any]) -> int:
    """The echo engine's tokens: words."""
    return sum(len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


METRICS_DIALECTS = ("llamacpp", "vllm")


def metrics_text(dialect: str, model: str, running: int) -> str:
    """Prometheus text as llama.cpp's ``llama-server --metrics`` or vLLM publish their load gauges."""
    if dialect == "llamacpp":
        lines = []
        for name, value in (
            ("requests_processing", running),
            ("requests_deferred", 0),
            ("n_busy_slots_per_decode", float(running)),
        ):
            lines += [
                f"# HELP llamacpp:{name} {name.replace('_', ' ')}",
                f"# TYPE llamacpp:{name} gauge",
                f"llamacpp:{name} {value}",
            ]
        return "\n".join(lines) + "\n"
    labels = f'{{engine="0",model_name="{model}"}}'
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {float(running)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{labels} 0.0\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{labels} {min(running / 100, 1.0)}\n"
    )


# ``GET /stats`` keeps this many of the latest requests' times.
STATS_KEPT = 1000


def make_handler(model: str, metrics: str | None = None) -> type[BaseHTTPRequestHandler]:
    dimensions = dimensions_of(model)
    in_flight = [0]
    peak = [0]
    # [began, ended or None] of the latest requests, Unix time: tests read the engine's own concurrency.
    timeline: deque[list[float | None]] = deque(maxlen=STATS_KEPT)
    counting = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, text: str, prompt_tokens: int, include_usage: bool) -> None:
            """Server-sent events, one word a chunk with a pause between, then [DONE] (chunked). With
            ``stream_options.include_usage``, as OpenAI: a last chunk with ``usage`` and no choices."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            burst = "__burst__" in text
            gathered = io.BytesIO()
            if burst:  # head and chunks gathered here, then written at once
                socket_writer, self.wfile = self.wfile, gathered
            self.end_headers()
            created = int(time.time())
            words = text.split(" ")
            for i, word in enumerate(words):
                delta = {"role": "assistant", "content": word if i == 0 else " " + word}
                chunk = {
                    "id": f"chatcmpl-{created}",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                if not burst:
                    time.sleep(STREAM_PAUSE_S)
            final = {
                "id": f"chatcmpl-{created}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
            self._chunk(f"data: {json.dumps(final)}\n\n".encode())
            if include_usage:
                usage = {
                    "id": f"chatcmpl-{created}",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": _usage(prompt_tokens, len(words)),
                }
                self._chunk(f"data: {json.dumps(usage)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
            if burst:
                self.wfile = socket_writer
                self.wfile.write(gathered.getvalue())

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok", "model": model})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            elif self.path == "/stats":
                with counting:
                    stats = {
                        "in_flight": in_flight[0],
                        "peak": peak[0],
                        "requests": [list(t) for t in timeline],
                    }
                self._json(200, stats)
            elif self.path == "/metrics" and metrics:
                body = metrics_text(metrics, model, in_flight[0]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            times: list[float | None] = [time.time(), None]
            with counting:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
                timeline.append(times)
            try:
                self._post()
            finally:
                with counting:
                    in_flight[0] -= 1
                    times[1] = time.time()

        def _post(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "body is not JSON"}})
                return
            # A test engine can be asked to fail: input "__status_500__" (or any status) answers with it.
            trigger = json.dumps(request.get("input", ""))
            if "__status_" in trigger:
                status = int(trigger.split("__status_", 1)[1].split("__", 1)[0])
                self._json(status, {"error": {"message": f"asked to fail with {status}"}})
                return
            if self.path == "/v1/embeddings":
                inputs = request.get("input", [])
                inputs = [inputs] if isinstance(inputs, str) else list(inputs)
                data = [
                    {"object": "embedding", "index": i, "embedding": vector(str(t), model, dimensions)}
                    for i, t in enumerate(inputs)
                ]
                self._json(
                    200,
                    {
                        "object": "list",
                        "model": model,
                        "data": data,
                        "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
                    },
                )
            elif self.path == "/v1/chat/completions" and request.get("stream"):
                messages = request.get("messages") or [{"content": ""}]
                options = request.get("stream_options") or {}
                self._stream(
                    f"echo: {messages[-1].get('content', '')}",
                    _words(messages),
                    bool(options.get("include_usage")),
                )
            elif self.path == "/v1/chat/completions":
                messages = request.get("messages") or [{"content": ""}]
                text = str(messages[-1].get("content", ""))
                self._json(
                    200,
                    {
                        "id": f"chatcmpl-{int(time.time() * 1000)}",
                        "object": "chat.completion",
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": f"echo: {text}"},
                            }
                        ],
                        "usage": _usage(_words(messages), len(f"echo: {text}".split(" "))),
                    },
                )
            else:
                self._json(404, {"error": {"message": "not found"}})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.engines.echo")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="echo")
    parser.add_argument("--metrics", choices=METRICS_DIALECTS, default=None)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.model, args.metrics))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever(poll_interval=0.2)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
