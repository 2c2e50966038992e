"""The gateway's lean Redis client (apps/gateway/resp.py), against the real Redis: replies parsed across
any cut, error replies, the script loaded on NOSCRIPT, commands pipelined in order, and a lost or silent
server failing the calls waiting on it (then a new connection)."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading

import pytest
import redis
from django.conf import settings

from apps.gateway.resp import LeanRedis, RespError, RespUnavailable, encode, parse
from tests.fixtures import free_port, run_in_own_loop


def test_replies_are_parsed_whole_or_not_at_all():
    stream = b"+OK\r\n-ERR wrong\r\n:42\r\n$5\r\nhello\r\n$-1\r\n*3\r\n:0\r\n$3\r\nabc\r\n*1\r\n:7\r\n"
    replies, at = [], 0
    while (found := parse(stream, at)) is not None:
        reply, at = found
        replies.append(reply)
    assert replies[0] == b"OK" and isinstance(replies[1], RespError) and str(replies[1]) == "ERR wrong"
    assert replies[2:] == [42, b"hello", None, [0, b"abc", [7]]]
    for cut in range(1, len(stream)):  # a reply cut anywhere is incomplete, never a wrong reply
        parsed, at = [], 0
        while (found := parse(stream[:cut], at)) is not None:
            reply, at = found
            parsed.append(reply)
        assert [str(r) if isinstance(r, RespError) else r for r in parsed] == [
            str(r) if isinstance(r, RespError) else r for r in replies[: len(parsed)]
        ], cut
        assert len(parsed) < len(replies)
    assert encode("SET", "k", 5) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n"


def test_a_script_runs_by_digest_and_is_loaded_when_the_server_lacks_it():
    script = "return {tonumber(ARGV[1]) + 1, KEYS[1]}"
    import hashlib

    sha = hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()
    redis.Redis.from_url(settings.CELERY_BROKER_URL).script_flush()
    results: list[object] = []

    async def main() -> None:
        client = LeanRedis(settings.CELERY_BROKER_URL)
        results.append(await client.evalsha(sha, script, ["k1"], [41]))  # NOSCRIPT, then EVAL
        results.append(await client.evalsha(sha, script, ["k2"], [1]))
        # Pipelined on one connection, answered in order.
        results.append(await asyncio.gather(*(client.command("ECHO", i) for i in range(50))))
        with pytest.raises(RespError):
            await client.command("NOSUCHCOMMAND")
        results.append(await client.command("PING"))  # the connection goes on after an error reply

    run_in_own_loop(main)
    assert results[0] == [42, b"k1"] and results[1] == [2, b"k2"]
    assert results[2] == [str(i).encode() for i in range(50)]
    assert results[3] == b"PONG"


def test_a_silent_or_absent_server_fails_the_waiting_calls_and_a_new_connection_follows():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    outcomes: list[str] = []

    async def main() -> None:
        client = LeanRedis(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout=0.2)
        for attempt in (client.command("PING"), client.command("PING")):
            try:
                await attempt
            except RespUnavailable as exc:
                outcomes.append(str(exc))
        away = LeanRedis(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
        try:
            await away.command("PING")
        except RespUnavailable as exc:
            outcomes.append(str(exc))

    run_in_own_loop(main)
    silent.close()
    assert outcomes[0].startswith("no reply within") and len(outcomes) == 3
    assert outcomes[2].startswith("cannot connect")


def test_a_pipeline_failed_by_a_silent_server_leaves_no_future_unretrieved():
    """A frozen Redis (SIGSTOPped: it accepts and never answers) failed every reply of a flush's pipeline
    together, and the flush awaited only the first: the others' errors were logged as "Future exception
    was never retrieved", a traceback per command per second per process (issue 48: ~2,000 in 30 s)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    accepted: list[socket.socket] = []  # held open, as a frozen server's connection is
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    unhandled: list[str] = []
    outcomes: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: unhandled.append(context["message"])
        )
        client = LeanRedis(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout=0.2)
        try:
            async with client.pipeline() as pipe:
                pipe.hincrby("t:hash", "a", 1)
                pipe.expire("t:hash", 60)
                pipe.hgetall("t:hash")
                await pipe.execute()
        except RespUnavailable as exc:
            outcomes.append(str(exc))

    run_in_own_loop(main)
    gc.collect()  # an unretrieved future says so when it is collected
    silent.close()
    assert [o[: len("no reply within")] for o in outcomes] == ["no reply within"]
    assert unhandled == []


def test_a_fired_command_leaves_with_the_next_one_or_alone_after_its_moment():
    """``fire``: no reply awaited; sent in order before a command that follows within its moment, and
    alone when none follows (the release of a concurrency slot, apps/gateway/limits.py)."""
    plain = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    plain.delete("mf-test:fired", "mf-test:alone")
    seen: list[object] = []

    async def main() -> None:
        client = LeanRedis(settings.CELERY_BROKER_URL)
        await client.command("PING")  # connected: a fired command goes straight onto the connection
        client.fire(encode("SET", "mf-test:fired", "1"), within=5.0)
        seen.append(await client.command("GET", "mf-test:fired"))  # sent after it, in the same write
        client.fire(encode("SET", "mf-test:alone", "1"), within=0.05)
        await asyncio.sleep(0.3)
        seen.append(plain.get("mf-test:alone"))
        seen.append(await client.command("ECHO", "in order"))  # its reply was dropped, not taken for this

    run_in_own_loop(main)
    assert seen == [b"1", b"1", b"in order"]


def test_a_pipeline_answers_as_redis_py_does_and_survives_its_event_loop():
    """The flush's pipeline (apps/gateway/lbstate.py) on the lean client: the replies shaped as redis-py's
    pipeline shapes them, against the real server; an error reply raises after every reply came; a client
    whose connection was made on a loop that has closed connects again on the next one."""
    client = LeanRedis(settings.CELERY_BROKER_URL)
    expected_by_redis_py = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    expected_by_redis_py.delete("t:hash", "t:z", "t:n")

    def commands(pipe) -> None:
        pipe.hincrby("t:hash", "a", 3)
        pipe.hset("t:hash", mapping={"b": 2, "c": "x"})
        pipe.expire("t:hash", 60)
        pipe.expire("t:absent", 60)
        pipe.zadd("t:z", {"one": 1.5, "two": 2.0})
        pipe.zremrangebyscore("t:z", 0, 1.6)
        pipe.zrange("t:z", 0, -1)
        pipe.hgetall("t:hash")
        pipe.hmget("t:hash", ["a", "nope"])
        pipe.hdel("t:hash", "c")
        pipe.incrby("t:n", 5)
        pipe.delete("t:n", "t:absent")

    async def lean() -> list:
        async with client.pipeline() as pipe:
            commands(pipe)
            return await pipe.execute()

    got = run_in_own_loop(lean)  # a loop of its own: the next run's is another
    expected_by_redis_py.delete("t:hash", "t:z", "t:n")
    with expected_by_redis_py.pipeline(transaction=False) as pipe:
        commands(pipe)
        expected = pipe.execute()
    assert got == expected
    assert got[7] == {b"a": b"3", b"b": b"2", b"c": b"x"} and got[3] is False and got[6] == [b"two"]

    async def wrong_type() -> None:
        async with client.pipeline() as pipe:
            pipe.hincrby("t:z", "a", 1)  # a sorted set
            pipe.incrby("t:n", 1)
            await pipe.execute()

    with pytest.raises(RespError, match="WRONGTYPE"):
        run_in_own_loop(wrong_type)
    assert expected_by_redis_py.get("t:n") == b"1"  # the command after the error ran (deleted above)
