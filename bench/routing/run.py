"""Routing benchmark on real engines: prefix-cache affinity against the load-only algorithms and LiteLLM.

    python bench/routing/run.py [--rate 0.5] [--seconds 90] [--tenants 6] [--cache-entries 3] [--quick]

A throw-away PostgreSQL 16 + Redis; two llama-cpp-python servers with the Gemma 3 270M GGUF (``make
engines``), each on one thread pinned to its own core (0 and 1), prompt caching on (``--cache``, a RAM
cache of ``--cache-entries`` saved states each, fewer than the tenants; see README.md for why); both
registered as running model servers of one cluster serving chat.general@1, behind the web application
under gunicorn (``--web-workers`` uvicorn workers, unpinned, as is this client).

The workload: ``--tenants`` tenants, each with its own system prompt of at least ``--system-tokens`` tokens
of the Gemma tokenizer (deterministic, varied text; counted by the engine's ``/extras/tokenize/count``),
and short user turns; Poisson arrivals at ``--rate`` requests/s for ``--seconds`` seconds (seeded: every
series gets the same schedule); streamed chat completions of ``--max-tokens`` tokens at temperature 0.

Series, in one run and in this order: the cluster's algorithm set to weighted_round_robin,
least_connections, least_outstanding and prefix_affinity (an algorithm this checkout does not have is
skipped and said so), then LiteLLM's proxy over the same two engines (simple-shuffle, least-busy; from the
virtual environment ``--litellm``, skipped when it is not there). Before every series both engines are
restarted (empty caches) and sent one fixed unrelated prompt directly: every series starts from the same
engine state.

Per series: time to first token (the first chunk with text: mean, p50, p99), completed requests/s and
tokens/s (over first arrival to last completion), per backend the share of requests and the most in flight
at once (seen by this client, from the ``x-modelforge-backend`` / ``x-litellm-model-api-base`` header), and
from the engines' own logs how much of the prompts they took from their cache. ``--calibrate`` measures a
cold and a warm prompt on one engine and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (
    demo_gguf,
    free_port,
    route_to_backends,
    start_llama_server,
    start_web,
    stop,
    throwaway_stack,
    wait_http,
)

CAPABILITY = "chat.general@1"
MODELFORGE = ("weighted_round_robin", "least_connections", "least_outstanding", "prefix_affinity")
LITELLM = ("litellm simple-shuffle", "litellm least-busy")
LITELLM_VENV = Path(
    os.environ.get("MODELFORGE_BENCH_LITELLM", Path(tempfile.gettempdir()) / "mf-bench-litellm" / "venv")
)
WARMUP = "Name one colour."  # the fixed unrelated prompt each engine answers before each series
# "Llama.generate: 1034 prefix-match hit, remaining 25 prompt tokens to eval" (the engine's --verbose)
PREFIX_LINE = re.compile(rb"Llama\.generate: (\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")
RAM_HIT = b"Llama._create_completion: cache hit"

# The tenants' system prompts: rules of an invented support desk, from these words, seeded per tenant.
COMPANIES = [
    "Arbor",
    "Ledger",
    "Quill",
    "Harbor",
    "Meridian",
    "Cobalt",
    "Juniper",
    "Saffron",
    "Tundra",
    "Orchid",
    "Vesper",
    "Granite",
]
TOPICS = [
    "refunds",
    "late deliveries",
    "damaged parcels",
    "invoices",
    "password resets",
    "account closures",
    "gift cards",
    "warranty claims",
    "address changes",
    "bulk orders",
    "price matching",
    "subscriptions",
    "loyalty points",
    "export paperwork",
    "accessibility requests",
    "data deletion",
    "spare parts",
    "installation visits",
]
ACTIONS = [
    "confirm",
    "escalate",
    "document",
    "summarise",
    "verify",
    "schedule",
    "decline politely",
    "approve",
    "forward",
    "record",
    "double-check",
    "acknowledge",
]
OBJECTS = [
    "order number",
    "customer's postcode",
    "original receipt",
    "serial number",
    "delivery slip",
    "billing address",
    "photo of the damage",
    "last four digits of the card",
    "account e-mail",
    "courier reference",
]
UNITS = ("hours", "business days", "minutes", "calendar days")
PRODUCTS = [
    "the Atlas kettle",
    "the Nimbus router",
    "the Fjord backpack",
    "the Orbit lamp",
    "the Cedar desk",
    "the Pulse watch",
    "the Lumen projector",
    "the Drift scooter",
    "the Ember stove",
    "the Halo headset",
]
TONES = ("warm", "brief", "formal", "patient", "cheerful", "precise")
QUESTIONS = (
    "What does rule {n} say?",
    "Can I get a refund for order {n}?",
    "My parcel {n} is late, what now?",
    "How do I reset my password? Ticket {n}.",
    "Is {p} covered by warranty? Case {n}.",
    "Please change my address, order {n}.",
)


def system_prompt(tenant: int, rules: int) -> str:
    rng = random.Random(f"tenant-{tenant}")  # noqa: S311 -- text, not secrets
    company = f"{rng.choice(COMPANIES)} {rng.choice(COMPANIES)} {tenant}"
    lines = [
        f"You are the {rng.choice(TONES)} support assistant of {company}. Answer in one short sentence and "
        f"follow these {rules} rules exactly.",
    ]
    for number in range(1, rules + 1):
        lines.append(
            f"Rule {number}: when a customer asks about {rng.choice(TOPICS)} for {rng.choice(PRODUCTS)}, "
            f"{rng.choice(ACTIONS)} the {rng.choice(OBJECTS)} within {rng.randint(2, 90)} {rng.choice(UNITS)}"
            f" and quote code {company[:2].upper()}-{rng.randint(100, 9999)}."
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the series' start
    tenant: int
    question: str


def schedule(rate: float, seconds: float, tenants: int, seed: int) -> list[Arrival]:
    """Poisson arrivals (exponential gaps) at ``rate``/s, each for a tenant drawn uniformly."""
    rng = random.Random(seed)  # noqa: S311 -- a workload, not secrets
    arrivals: list[Arrival] = []
    at = rng.expovariate(rate)
    while at < seconds:
        question = rng.choice(QUESTIONS).format(n=rng.randint(1, 40), p=rng.choice(PRODUCTS))
        arrivals.append(Arrival(at, rng.randrange(tenants), question))
        at += rng.expovariate(rate)
    return arrivals


@dataclass
class Result:
    tenant: int
    sent: float  # loop time
    first: float | None = None
    ended: float = 0.0
    backend: str = "?"
    tokens: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.tokens > 0


@dataclass
class Target:
    """Where a series sends its requests."""

    label: str
    url: str
    headers: dict[str, str]
    model: str
    backend_of: Any  # response headers -> backend name


async def one_request(
    client: httpx.AsyncClient, target: Target, arrival: Arrival, system: str, max_tokens: int, start: float
) -> Result:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start + arrival.at - loop.time()))
    result = Result(arrival.tenant, loop.time())
    body = {
        "model": target.model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": arrival.question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    try:
        async with client.stream("POST", target.url, json=body, headers=target.headers) as response:
            result.backend = target.backend_of(response.headers)
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        result.tokens += 1
                        if result.first is None:
                            result.first = loop.time()
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    result.ended = loop.time()
    return result


async def run_series(
    target: Target, arrivals: list[Arrival], systems: list[str], max_tokens: int
) -> list[Result]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=limits) as client:
        start = asyncio.get_running_loop().time() + 0.2
        return list(
            await asyncio.gather(
                *(one_request(client, target, a, systems[a.tenant], max_tokens, start) for a in arrivals)
            )
        )


# Engines ----------------------------------------------------------------------------------------------


@dataclass
class Engine:
    name: str
    port: int
    core: str
    log: Path
    process: subprocess.Popen[bytes] | None = None
    mark: int = 0  # log offset where the current series began

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, env: dict[str, str], gguf: Path, n_ctx: int, extra: list[str]) -> None:
        self.process = start_llama_server(
            env, gguf, self.port, core=self.core, n_ctx=n_ctx, extra=extra, log=self.log
        )

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def since_mark(self) -> bytes:
        with self.log.open("rb") as handle:
            handle.seek(self.mark)
            return handle.read()

    def set_mark(self) -> None:
        self.mark = self.log.stat().st_size


def engine_args(cache_bytes: int, n_batch: int) -> list[str]:
    """Streams run to the end when another request waits (the server's default, --interrupt_requests
    True, cuts the running stream short as soon as a second request arrives); a RAM cache of
    ``cache_bytes`` when above 0 (0: only the one-slot prefix reuse of llama-cpp-python's Llama)."""
    args = ["--interrupt_requests", "False", "--n_batch", str(n_batch)]
    if cache_bytes > 0:
        args += ["--cache", "True", "--cache_type", "ram", "--cache_size", str(cache_bytes)]
    return args


def restart(engines: list[Engine], env: dict[str, str], gguf: Path, n_ctx: int, extra: list[str]) -> None:
    """Both engines from scratch, then the same unrelated prompt to each: the same state for every series."""
    for engine in engines:
        engine.stop()
    for engine in engines:
        engine.start(env, gguf, n_ctx, extra)
    for engine in engines:
        for _ in range(3):  # a port can be taken meanwhile by a client's ephemeral port: try again
            deadline = time.monotonic() + 180
            while (
                engine.process is not None and engine.process.poll() is None and time.monotonic() < deadline
            ):
                try:
                    if httpx.get(f"{engine.base}/v1/models", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            if engine.process is not None and engine.process.poll() is None:
                break
            engine.start(env, gguf, n_ctx, extra)
        wait_http(f"{engine.base}/v1/models", 180)
        answer = httpx.post(
            f"{engine.base}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": WARMUP}], "max_tokens": 8, "temperature": 0},
            timeout=120,
        )
        answer.raise_for_status()
        engine.set_mark()


def token_count(engine: Engine, text: str) -> int:
    answer = httpx.post(f"{engine.base}/extras/tokenize/count", json={"input": text}, timeout=60)
    answer.raise_for_status()
    return int(answer.json()["count"])


@dataclass
class CacheUse:
    """What an engine's log says about the prompts of one series."""

    requests: int = 0
    reused: int = 0  # requests whose system prompt came from a cache (the one slot or the RAM cache)
    prompt_tokens: int = 0
    evaluated: int = 0
    ram_loads: int = 0

    def add(self, text: bytes, system_tokens: int) -> None:
        for match in PREFIX_LINE.finditer(text):
            prefix, remaining = int(match[1]), int(match[2])
            self.requests += 1
            self.reused += prefix >= system_tokens
            self.prompt_tokens += prefix + remaining
            self.evaluated += remaining
        self.ram_loads += text.count(RAM_HIT)


def wait_probes(since: float, backends: int, seconds: float = 20) -> bool:
    """Until every gateway process that probes has found every backend up after ``since`` (engines just
    restarted); True when it did. Processes that have not probed yet probe at their first request."""
    from apps.gateway.probe import read_verdicts

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        verdicts = read_verdicts() or {}
        seen = [v for per in verdicts.values() for v in per]
        if not seen or (len(verdicts) >= backends and all(v["up"] is True and v["at"] > since for v in seen)):
            return True
        time.sleep(0.25)
    return False


# LiteLLM ----------------------------------------------------------------------------------------------


def start_litellm(
    workdir: Path, strategy: str, engines: list[Engine], port: int, key: str
) -> subprocess.Popen[bytes]:
    folder = workdir / f"litellm-{strategy}"
    folder.mkdir()
    lines = ["model_list:"]
    for engine in engines:
        lines += [
            f"  - model_name: {CAPABILITY}",
            f'    litellm_params: {{model: openai/gemma, api_base: "{engine.base}/v1", api_key: none}}',
        ]
    lines += [
        "router_settings:",
        f"  routing_strategy: {strategy}",
        "  num_retries: 0",
        "  timeout: 600",
        "litellm_settings:",
        "  telemetry: false",
        "  callbacks: []",
        "  success_callback: []",
        "  failure_callback: []",
        "  turn_off_message_logging: true",
        "  set_verbose: false",
        "  request_timeout: 600",
        "general_settings:",
        f"  master_key: {key}",
        "  disable_spend_logs: true",
        "  disable_error_logs: true",
    ]
    (folder / "config.yaml").write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELFORGE_", "DATABASE_", "DJANGO_"))}
    env.update(
        LITELLM_TELEMETRY_DISABLED="true",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS="True",
        LITELLM_LOCAL_BLOG_POSTS="True",
        LITELLM_LOCAL_POLICY_TEMPLATES="True",
        LITELLM_LOCAL_AUTOROUTER_PRESETS="True",
        LITELLM_LOG="ERROR",
        LITELLM_DONT_SHOW_FEEDBACK_BOX="true",
        NO_PROXY="*",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    argv = [str(LITELLM_VENV / "bin" / "litellm"), "--config", str(folder / "config.yaml")]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    with (folder / "litellm.log").open("ab") as log:
        return subprocess.Popen(
            argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


# Figures ----------------------------------------------------------------------------------------------


@dataclass
class Figures:
    label: str
    results: list[Result]
    cache: CacheUse = field(default_factory=CacheUse)
    note: str = ""

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.ok]

    def ttft_ms(self) -> list[float]:
        return [((r.first or r.ended) - r.sent) * 1000 for r in self.ok]

    def span(self) -> float:
        return max(r.ended for r in self.results) - min(r.sent for r in self.results)

    def per_backend(self) -> dict[str, tuple[int, int]]:
        """backend -> (requests, most in flight at once, as this client saw it)."""
        out: dict[str, tuple[int, int]] = {}
        for backend in sorted({r.backend for r in self.results}):
            mine = [r for r in self.results if r.backend == backend]
            events = sorted([(r.sent, 1) for r in mine] + [(r.ended, -1) for r in mine])
            now = most = 0
            for _, step in events:
                now += step
                most = max(most, now)
            out[backend] = (len(mine), most)
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: with fewer than 100 values, p99 is the largest."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def ratio_interval(
    a: list[float], b: list[float], rounds: int = 10_000, seed: int = 17
) -> tuple[float, float]:
    """95 % bootstrap percentile interval of mean(a) / mean(b), each series resampled on its own."""
    rng = random.Random(seed)  # noqa: S311 -- resampling, not secrets
    ratios = sorted(
        statistics.fmean(rng.choices(a, k=len(a))) / statistics.fmean(rng.choices(b, k=len(b)))
        for _ in range(rounds)
    )
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def row(figures: Figures, tokens: int) -> str:
    ttft = figures.ttft_ms()
    total = len(figures.results)
    errors = total - len(figures.ok)
    if not ttft:
        return f"| {figures.label} | {total} | {errors} | - | - | - | - | - | - | - | - |"
    span = figures.span()
    load = ", ".join(
        f"{name} {count / total:.0%} (≤{most})" for name, (count, most) in figures.per_backend().items()
    )
    cache = figures.cache
    reused = f"{cache.reused}/{cache.requests}" if cache.requests else "-"
    evaluated = f"{cache.evaluated / cache.prompt_tokens:.0%}" if cache.prompt_tokens else "-"
    return (
        f"| {figures.label} | {total} | {errors} | {statistics.fmean(ttft):,.0f} | "
        f"{percentile(ttft, 50):,.0f} | "
        f"{percentile(ttft, 99):,.0f} | {len(figures.ok) / span:.3f} | "
        f"{sum(r.tokens for r in figures.ok) / span:.2f} | {load} | {reused} | {evaluated} |"
    )


HEADER = (
    "| series | requests | errors | TTFT mean ms | p50 ms | p99 ms | completed/s | tokens/s | "
    "per backend: share (most in flight) | system prompt from cache | prompt tokens evaluated |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
)


# Main -------------------------------------------------------------------------------------------------


def calibrate(engine: Engine, systems: list[str], max_tokens: int) -> None:
    """A cold and a warm prompt (same system prompt, another user turn) on one engine, sequential."""

    async def measure(tenant: int, question: str) -> tuple[float, float]:
        target = Target("direct", f"{engine.base}/v1/chat/completions", {}, "gemma", lambda h: engine.name)
        (result,) = await run_series(target, [Arrival(0, tenant, question)], systems, max_tokens)
        if not result.ok:
            raise RuntimeError(result.error)
        return ((result.first or result.ended) - result.sent) * 1000, (result.ended - result.sent) * 1000

    for tenant in range(min(3, len(systems))):
        cold = asyncio.run(measure(tenant, "What does rule 3 say?"))
        warm = asyncio.run(measure(tenant, "Can I get a refund for order 7?"))
        print(
            f"tenant {tenant}: cold TTFT {cold[0]:,.0f} ms (total {cold[1]:,.0f}), "
            f"warm TTFT {warm[0]:,.0f} ms (total {warm[1]:,.0f})"
        )
    print(engine.since_mark().decode(errors="replace")[-3000:])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=0.12, help="arrivals per second (0.12)")
    parser.add_argument("--seconds", type=float, default=75, help="arrivals over this long, per series (75)")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=1000, help="each system prompt at least (1000)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="before measuring a series, each tenant once through that series' routing (not measured)",
    )
    parser.add_argument(
        "--cache-entries", type=int, default=3, help="saved states each engine's RAM cache holds (3; 0: none)"
    )
    parser.add_argument("--n-batch", type=int, default=512)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument(
        "--probe-timeout-ms",
        type=int,
        help="MODELFORGE_GATEWAY_PROBE_TIMEOUT_MS for the web processes (default: the setting's, 1000); "
        "(the first runs needed 30000: engines were probed on /v1/models, answered between requests only)",
    )
    parser.add_argument(
        "--base-port",
        type=int,
        help="use the 10 ports from here (PostgreSQL, Redis, engines, web, LiteLLM); default: free ones",
    )
    parser.add_argument(
        "--series",
        default=",".join((*MODELFORGE, LITELLM[0])),
        help=f"comma-separated, from {', '.join(MODELFORGE + LITELLM)} (default: all but least-busy)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="two series: weighted round robin, prefix affinity"
    )
    parser.add_argument("--calibrate", action="store_true", help="cold and warm prompt times, then exit")
    args = parser.parse_args()
    if args.quick and args.series == parser.get_default("series"):
        args.series = "weighted_round_robin,prefix_affinity"
    wanted = args.series.split(",")
    wall = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the engines and the stack on SIGTERM too
    processes: list[subprocess.Popen[bytes]] = []
    engines: list[Engine] = []
    ports = iter(range(args.base_port, args.base_port + 10)) if args.base_port else None

    def port() -> int:
        return next(ports) if ports is not None else free_port()

    with throwaway_stack(port(), port()) as (workdir, env):
        from apps.clusters.choices import Algorithm
        from apps.clusters.models import ClientCredential

        gguf = demo_gguf(workdir / "models")
        engines = [
            Engine("a", port(), "0", workdir / "engine-a.log"),
            Engine("b", port(), "1", workdir / "engine-b.log"),
        ]
        try:
            # The size of one saved state, from a first engine with a cache of one byte (it saves anyway).
            restart(engines[:1], env, gguf, args.n_ctx, engine_args(1, args.n_batch))
            rules = 20
            systems: list[str] = []
            counts: list[int] = []
            for tenant in range(args.tenants):
                while True:
                    text = system_prompt(tenant, rules)
                    count = token_count(engines[0], text)
                    if count >= args.system_tokens:
                        break
                    rules += 2
                systems.append(text)
                counts.append(count)
            print(
                f"system prompts: {args.tenants} tenants, {min(counts)}-{max(counts)} tokens "
                "(the engine's tokenizer)"
            )
            if args.calibrate:
                calibrate(engines[0], systems, args.max_tokens)
                return 0
            state_bytes = probe_state_bytes(engines[0], systems[0], args.max_tokens)
            cache_bytes = int(state_bytes * (args.cache_entries + 0.5)) if args.cache_entries else 0
            extra = engine_args(cache_bytes, args.n_batch)
            print(
                f"one saved state: {state_bytes / 2**20:,.1f} MiB of llama.cpp state "
                "(what --cache_size counts); "
                f"cache {cache_bytes / 2**20:,.1f} MiB ≈ {args.cache_entries} states per engine"
            )
            names = {e.name: e for e in engines}
            cluster = route_to_backends(
                "127.0.0.1",
                {e.name: e.port for e in engines},
                capabilities=[CAPABILITY],
                profile="llamacpp-gguf",
            )
            _, key = ClientCredential.objects.mint(name="bench", scopes=[CAPABILITY])
            web_port = port()
            if args.probe_timeout_ms:
                env["MODELFORGE_GATEWAY_PROBE_TIMEOUT_MS"] = str(args.probe_timeout_ms)
            web = start_web(env, web_port, workers=args.web_workers, pin_core=None)
            processes.append(web)
            wait_http(f"http://127.0.0.1:{web_port}/healthz")
            arrivals = schedule(args.rate, args.seconds, args.tenants, args.seed)
            load = os.getloadavg()
            print(
                f"{len(arrivals)} arrivals over {args.seconds:g} s (Poisson, {args.rate:g}/s, "
                f"seed {args.seed}); max_tokens {args.max_tokens}; engines "
                f"{', '.join(f'{e.name} on core {e.core}' for e in engines)}; "
                f"{args.web_workers} web workers; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
            )
            min_system = min(counts) - 8  # what a request reuses when its system prompt was cached
            done: list[Figures] = []
            for label in wanted:
                target: Target | None = None
                litellm: subprocess.Popen[bytes] | None = None
                note = ""
                restart(engines, env, gguf, args.n_ctx, extra)
                began = time.time()
                if label in MODELFORGE:
                    if label not in Algorithm.values:
                        print(
                            f"{label}: not an algorithm of this checkout (apps/clusters/choices.py); skipped"
                        )
                        continue
                    cluster.algorithm = label
                    cluster.save(update_fields=["algorithm"])
                    if not wait_probes(began, len(engines)):
                        note = "gateway probes not all fresh at the start"
                    time.sleep(1.5)  # the routing table's refresh (a pub/sub notice; at worst its 1 s check)
                    target = Target(
                        label,
                        f"http://127.0.0.1:{web_port}/v1/chat/completions",
                        {"Authorization": f"Bearer {key}"},
                        CAPABILITY,
                        lambda h: h.get("x-modelforge-backend", "?"),
                    )
                elif label in LITELLM:
                    if not (LITELLM_VENV / "bin" / "litellm").exists():
                        print(f"{label}: no LiteLLM at {LITELLM_VENV} (see README.md); skipped")
                        continue
                    proxy_port = port()
                    master = "sk-bench-" + os.urandom(8).hex()
                    litellm = start_litellm(workdir, label.split()[1], engines, proxy_port, master)
                    wait_http(f"http://127.0.0.1:{proxy_port}/health/liveliness", 240)
                    bases = {f"{e.base}/v1": e.name for e in engines}
                    target = Target(
                        label,
                        f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                        {"Authorization": f"Bearer {master}"},
                        CAPABILITY,
                        lambda h, bases=bases: bases.get(
                            h.get("x-litellm-model-api-base", "").rstrip("/"), "?"
                        ),
                    )
                else:
                    print(f"{label}: unknown series; skipped")
                    continue
                try:
                    if args.warmup:
                        # Each tenant once, at once, through the series' own routing; then measure from
                        # caches that routing filled (its steady state, not its cold start).
                        warm = [Arrival(0.25 * t, t, "Hello.") for t in range(args.tenants)]
                        asyncio.run(run_series(target, warm, systems, args.max_tokens))
                        for engine in engines:
                            engine.set_mark()
                    results = asyncio.run(run_series(target, arrivals, systems, args.max_tokens))
                finally:
                    if litellm is not None:
                        stop(litellm)
                figures = Figures(label, results, note=note)
                for engine in engines:
                    figures.cache.add(engine.since_mark(), min_system)
                done.append(figures)
                print(row(figures, args.max_tokens), flush=True)
                errors = [r.error for r in results if r.error]
                if errors:
                    print(f"  {len(errors)} errors, first: {errors[0]}")
            report(done, names)
            load = os.getloadavg()
            print(
                f"\nwall time {time.monotonic() - wall:,.0f} s; "
                f"ended {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
                f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
            )
        finally:
            for engine in engines:
                engine.stop()
            for process in processes:
                stop(process)
    return 0


def probe_state_bytes(engine: Engine, system: str, max_tokens: int) -> int:
    """llama.cpp's state size after one long prompt (the engine's verbose log says it at each save)."""
    httpx.post(
        f"{engine.base}/v1/chat/completions",
        json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}],
            "max_tokens": max_tokens,
            "temperature": 0,
        },
        timeout=300,
    ).raise_for_status()
    sizes = re.findall(rb"Llama\.save_state: saving (\d+) bytes of llama state", engine.since_mark())
    if not sizes:
        raise RuntimeError("the engine's log does not say the size of its saved state (--verbose off?)")
    return int(sizes[-1])


def report(done: list[Figures], names: dict[str, Engine]) -> None:
    print()
    print(HEADER)
    for figures in done:
        print(row(figures, 0))
    by_label = {f.label: f for f in done}
    wrr, affinity = by_label.get("weighted_round_robin"), by_label.get("prefix_affinity")
    if wrr and affinity and wrr.ttft_ms() and affinity.ttft_ms():
        a, w = affinity.ttft_ms(), wrr.ttft_ms()
        low, high = ratio_interval(a, w)
        print(
            "\nprefix_affinity / weighted_round_robin, mean TTFT: "
            f"{statistics.fmean(a) / statistics.fmean(w):.2f} "
            f"[95 % bootstrap {low:.2f}, {high:.2f}]; completed/s {len(affinity.ok) / affinity.span():.3f} "
            f"against {len(wrr.ok) / wrr.span():.3f}"
        )
    for figures in done:
        if figures.note:
            print(f"{figures.label}: {figures.note}")


if __name__ == "__main__":
    sys.exit(main())
