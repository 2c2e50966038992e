"""`make run`'s machinery: embedded PostgreSQL 16 and Redis, migrate, the operator login, web + worker +
beat, a clean stop on Ctrl-C, and a crashed process started again (or, if it keeps crashing, a stop) —
run for real in a throw-away data folder on free ports."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from modelforge import devguard
from modelforge.devstack import DataFolderLock, Ending, ServiceWatch, Supervisor
from modelforge.embedded import EmbeddedStack, EmbeddedStackError, port_defaults
from tests.fixtures import (
    PYTHON,
    free_port,
    http_ok,
    process_env,
    run_command,
    start_process,
    wait_until,
)

pytestmark = pytest.mark.stack


def test_the_embedded_platform_starts_serves_and_stops_cleanly(tmp_path):
    home = tmp_path / "home"
    web_port, pg_port, redis_port = free_port(), free_port(), free_port()
    env = process_env(
        MODELFORGE_HOME=str(home),
        MODELFORGE_PORT=str(web_port),
        MODELFORGE_EMBEDDED_PG_PORT=str(pg_port),
        MODELFORGE_EMBEDDED_REDIS_PORT=str(redis_port),
        MODELFORGE_DATABASE_URL=None,
        MODELFORGE_REDIS_URL=None,
        MODELFORGE_SECRET_KEY=None,
        MODELFORGE_OPERATOR_API_KEY=None,
        MODELFORGE_CLUSTER_SECRET=None,
        MODELFORGE_WEB_WORKERS="1",
        MODELFORGE_WORKER_CONCURRENCY="1",
        MODELFORGE_AGENT_PORT=str(free_port()),
    )
    running = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run.log")
    base = f"http://127.0.0.1:{web_port}"
    try:
        assert wait_until(lambda: "ModelForge is running at" in running.log(), 180), running.log()[-4000:]
        assert "Created the operator login: username 'operator'" in running.log()
        login = (home / "secrets" / "operator-login").read_text()
        assert login.startswith("username=operator\npassword=")
        assert oct((home / "secrets" / "operator-login").stat().st_mode & 0o777) == "0o600"
        assert http_ok(base + "/readyz")

        key = (home / "secrets" / "operator-api-key").read_text().strip()
        request = urllib.request.Request(
            base + "/api/v1/system/status", headers={"Authorization": f"Bearer {key}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            status = json.loads(response.read())
        assert status["database"]["detail"].startswith("PostgreSQL 16")

        # Beat's probe (or the worker's first task) reaches the worker: the whole loop runs.
        probe = urllib.request.Request(
            base + "/api/v1/system/worker-probe", method="POST", headers={"Authorization": f"Bearer {key}"}
        )
        urllib.request.urlopen(probe, timeout=5).close()

        def worker_seen() -> bool:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())["worker_seen_at"] is not None

        assert wait_until(worker_seen, 60, interval=1), running.log()[-4000:]

        # The local node's agent enrolled and reports: one real node online with real figures.
        nodes_request = urllib.request.Request(
            base + "/api/v1/nodes?liveness=online", headers={"Authorization": f"Bearer {key}"}
        )

        def local_node_online() -> bool:
            with urllib.request.urlopen(nodes_request, timeout=5) as response:
                return json.loads(response.read())["count"] == 1

        assert wait_until(local_node_online, 60, interval=1), running.log()[-4000:]
        with urllib.request.urlopen(nodes_request, timeout=5) as response:
            local = json.loads(response.read())["results"][0]
        assert local["memory_total_bytes"] > 0 and local["assignable"] is True

        # A model server can be started at once: the test-echo profile on the demo model of the local node.
        place = urllib.request.Request(
            base + "/api/v1/servers",
            method="POST",
            data=json.dumps({"name": "demo", "profile": "test-echo", "model": "echo-demo"}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(place, timeout=10) as response:
            server = json.loads(response.read())
        assert server["node_name"] == local["name"]
        server_request = urllib.request.Request(
            base + f"/api/v1/servers/{server['id']}", headers={"Authorization": f"Bearer {key}"}
        )

        def demo_running() -> bool:
            with urllib.request.urlopen(server_request, timeout=5) as response:
                return json.loads(response.read())["state"] == "running"

        assert wait_until(demo_running, 60, interval=1), running.log()[-4000:]

        # make run's demo: a served request, called the way its printed lines say.
        assert wait_until(logged(running, "or, in Python (pip install openai):"), 180), running.log()[-4000:]
        assert "curl -s " + base + "/v1/chat/completions" in running.log()
        credential_file = home / "secrets" / "demo-client-credential"
        assert oct(credential_file.stat().st_mode & 0o777) == "0o600"
        credential = credential_file.read_text().strip()
        assert ask_the_demo(base, credential) == "echo: hello"
    finally:
        code = interrupt(running)
    assert_stopped_cleanly(code, running.log(), home, base)

    # A second run reuses the data: same database, no second operator login.
    again = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run-again.log")
    try:
        assert wait_until(lambda: "ModelForge is running at" in again.log(), 120), again.log()[-4000:]
        assert "An operator login already exists" in again.log()
        assert "Applying" not in again.log()

        # The local agent came back with its kept identity: still exactly one node, the same one.
        def same_single_node() -> bool:
            request = urllib.request.Request(
                base + "/api/v1/nodes", headers={"Authorization": f"Bearer {key}"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                body = json.loads(response.read())
            return (
                body["count"] == 1
                and body["results"][0]["id"] == local["id"]
                and body["results"][0]["liveness"] == "online"
            )

        assert wait_until(same_single_node, 60, interval=1), again.log()[-4000:]
        assert (home / "secrets" / "operator-login").read_text() == login
        # The demo again, from what the first run made: the same credential, answering again.
        assert wait_until(logged(again, "or, in Python (pip install openai):"), 180), again.log()[-4000:]
        assert credential_file.read_text().strip() == credential
        assert ask_the_demo(base, credential) == "echo: hello"
    finally:
        code = interrupt(again)
    assert_stopped_cleanly(code, again.log(), home, base)


def ask_the_demo(base: str, credential: str) -> str:
    """The demo's printed Python lines: the ``openai`` package asks ``demo.echo@1`` through the gateway."""
    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key=credential)
    answer = client.chat.completions.create(
        model="demo.echo@1", messages=[{"role": "user", "content": "hello"}]
    )
    return str(answer.choices[0].message.content)


def interrupt(running) -> int:
    """Ctrl-C, as a terminal would send it to the foreground process."""
    if running.process.poll() is None:
        os.killpg(running.process.pid, signal.SIGINT)
    return running.process.wait(60)


def assert_stopped_cleanly(code: int, log: str, home, base: str) -> None:
    assert code == 0, log[-3000:]
    assert "modelforge: stopped" in log
    assert not (home / "postgres" / "data" / "postmaster.pid").exists()
    assert not (home / "redis" / "redis.pid").exists()
    assert not http_ok(base + "/healthz")


# --- Supervision: a crashed process is started again; one that keeps crashing ends the run ------------


def quick_supervisor(first_delay: float = 0.2, crash_limit: int = 4, window: float = 60) -> Supervisor:
    """A supervisor with a short back-off: 0.2, 0.4, 0.8 s, and the fourth crash in a minute ends it."""
    return Supervisor(process_env(), first_delay=first_delay, crash_limit=crash_limit, window=window)


def supervise_until(supervisor: Supervisor, predicate, timeout: float = 20) -> list[Ending]:
    """Turn the supervision loop the way ``run()`` does until ``predicate()``; the endings it returned."""
    endings: list[Ending] = []

    def turned() -> bool:
        ending = supervisor.check()
        if ending is not None:
            endings.append(ending)
        return bool(endings) or predicate()

    wait_until(turned, timeout, interval=0.05)
    return endings


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_process_is_started_again_after_a_back_off_that_doubles(capsys):
    supervisor = quick_supervisor()
    supervisor.start("worker", [PYTHON, "-c", "import time; print('worker up', flush=True); time.sleep(60)"])
    try:
        delays = []
        for _ in (1, 2):
            before = supervisor.children["worker"].process
            assert wait_until(lambda: "worker up" in supervisor.children["worker"].output, 10)
            os.kill(before.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            endings = supervise_until(
                supervisor, lambda before=before: supervisor.children["worker"].process is not before
            )
            delays.append(time.monotonic() - killed_at)
            assert endings == []
            after = supervisor.children["worker"].process
            assert after is not before and after.poll() is None
            supervisor.children["worker"].output.clear()
        out = capsys.readouterr().out
        assert (
            "the worker process exited with status -9 (SIGKILL); restarting it in 0.2 s (crash 1 of 4" in out
        )
        assert "restarting it in 0.4 s (crash 2 of 4 within 60 s)" in out
        assert f"restarted the worker process (pid {after.pid})" in out
        # The back-off is waited out, not skipped: 0.2 s, then 0.4 s.
        assert delays[0] >= 0.2 and delays[1] >= 0.4
    finally:
        supervisor.stop_all(grace=5)
    assert supervisor.children["worker"].process.poll() is not None


def test_a_process_that_keeps_crashing_ends_the_run_naming_it_with_its_last_lines(capsys):
    supervisor = quick_supervisor(first_delay=0.05)
    supervisor.start("web", [PYTHON, "-c", "import time; time.sleep(60)"])
    supervisor.start(
        "beat", [PYTHON, "-c", "print('beat: cannot reach the broker', flush=True); raise SystemExit(1)"]
    )
    try:
        endings = supervise_until(supervisor, lambda: False)
        assert len(endings) == 1, capsys.readouterr().out
        ending = endings[0]
        assert ending.code == 1
        assert ending.lines[0] == (
            "the beat process crashed 4 times within 60 s (last: status 1); stopping everything. "
            "Its last lines:"
        )
        assert "    beat: cannot reach the broker" in ending.lines[1:]
        out = capsys.readouterr().out
        # Three restarts, then the fourth crash inside the window ends it.
        assert out.count("restarted the beat process") == 3
        assert "restarting it in 0.2 s (crash 3 of 4 within 60 s)" in out
        web = supervisor.children["web"].process
        assert web.poll() is None  # the others run on until run() stops everything
    finally:
        supervisor.stop_all(grace=5)
    assert web.poll() is not None


def test_crashes_older_than_the_window_do_not_count_toward_giving_up(capsys):
    supervisor = quick_supervisor(first_delay=0.05, crash_limit=2, window=0.5)
    supervisor.start("beat", [PYTHON, "-c", "import time; time.sleep(0.7); raise SystemExit(1)"])
    try:
        # Each run outlives the window, so every crash is the first inside it: restarted, never given up.
        endings = supervise_until(
            supervisor, lambda: "restarted the beat process" in capsys.readouterr().out, 10
        )
        assert endings == []
        endings = supervise_until(supervisor, lambda: False, 3)
        assert endings == []
    finally:
        supervisor.stop_all(grace=5)


def test_a_refused_start_ends_the_run_at_once_without_a_restart(capsys):
    supervisor = quick_supervisor()
    supervisor.start(
        "web", [PYTHON, "-c", "print('[MISSING_REQUIRED_SETTING] ...', flush=True); raise SystemExit(3)"]
    )
    first = supervisor.children["web"].process
    try:
        endings = supervise_until(supervisor, lambda: False)
        assert [(e.lines, e.code) for e in endings] == [
            (["the web process exited with status 3; stopping everything"], 3)
        ]
        assert supervisor.children["web"].process is first
        assert "restart" not in capsys.readouterr().out
    finally:
        supervisor.stop_all(grace=5)


def test_what_a_crashed_process_left_in_its_group_goes_before_it_starts_again(tmp_path):
    # Regression: a killed gunicorn master leaves its workers holding the port the new master must bind.
    pid_file = tmp_path / "leftover.pid"
    master = (
        "import subprocess, sys, time\n"
        f"leftover = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(leftover.pid))\n"
        "time.sleep(60)\n"
    )
    supervisor = quick_supervisor()
    supervisor.start("web", [PYTHON, "-c", master])
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 10)
        leftover = int(pid_file.read_text())
        first = supervisor.children["web"].process
        pid_file.unlink()
        os.kill(first.pid, signal.SIGKILL)
        supervise_until(supervisor, lambda: supervisor.children["web"].process is not first)
        assert not alive(leftover)
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 10)
    finally:
        supervisor.stop_all(grace=5)


@pytest.fixture
def stack_home():
    """A throw-away data folder outside pytest's temporary root: a pytest session starting meanwhile in
    another shell resets /tmp/pytest-of-<user> to 0700, and the embedded PostgreSQL (run as another user
    when we are root) then cannot reach its files by their full path and fails its shutdown checkpoint."""
    folder = Path(tempfile.mkdtemp(prefix="modelforge-devstack-"))
    yield folder / "home"
    shutil.rmtree(folder, ignore_errors=True)


def stack_env(home: Path, **overrides: str | None) -> tuple[dict[str, str], Path, str]:
    """``make run``'s environment in the data folder ``home``, on free ports: (env, home, base URL)."""
    web_port = free_port()
    env = process_env(
        MODELFORGE_HOME=str(home),
        MODELFORGE_PORT=str(web_port),
        MODELFORGE_EMBEDDED_PG_PORT=str(free_port()),
        MODELFORGE_EMBEDDED_REDIS_PORT=str(free_port()),
        MODELFORGE_DATABASE_URL=None,
        MODELFORGE_REDIS_URL=None,
        MODELFORGE_SECRET_KEY=None,
        MODELFORGE_OPERATOR_API_KEY=None,
        MODELFORGE_CLUSTER_SECRET=None,
        MODELFORGE_WEB_WORKERS="1",
        MODELFORGE_WORKER_CONCURRENCY="1",
        MODELFORGE_AGENT_PORT=str(free_port()),
        **{"MODELFORGE_DEMO": "false", **overrides},
    )
    return env, home, f"http://127.0.0.1:{web_port}"


ROLES = {
    "web": lambda argv: "gunicorn" in argv,
    "worker": lambda argv: "celery" in argv and "worker" in argv,
    "beat": lambda argv: "celery" in argv and "beat" in argv,
    "agent": lambda argv: argv[1:3] == ["-m", "agent"],
}


def children_of(parent: int) -> dict[int, list[str]]:
    """The live processes whose parent is ``parent``, with their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            state, ppid = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[:2]
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue
        if int(ppid) == parent and state != "Z":
            found[int(entry)] = argv
    return found


def stack_process(running, role: str) -> int | None:
    """The pid of the ``make run`` process that plays ``role`` (web, worker, beat, agent), if it runs."""
    pids = [pid for pid, argv in children_of(running.process.pid).items() if ROLES[role](argv)]
    return pids[0] if pids else None


def logged(running, text: str) -> Callable[[], bool]:
    return lambda: text in running.log()


def embedded_pids(home) -> tuple[int, int]:
    postgres = int((home / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
    redis = int((home / "redis" / "redis.pid").read_text().strip())
    return postgres, redis


def api(base: str, key: str, path: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


def test_killed_processes_come_back_while_the_databases_and_model_servers_stay_up(tmp_path, stack_home):
    env, home, base = stack_env(stack_home)
    running = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run.log")
    try:
        assert wait_until(lambda: "ModelForge is running at" in running.log(), 180), running.log()[-4000:]
        key = (home / "secrets" / "operator-api-key").read_text().strip()
        assert wait_until(lambda: stack_process(running, "agent") is not None, 30)
        assert wait_until(lambda: api(base, key, "/api/v1/nodes?liveness=online")["count"] == 1, 60, 1)
        server = api(
            base,
            key,
            "/api/v1/servers",
            "POST",
            {"name": "demo", "profile": "test-echo", "model": "echo-demo"},
        )
        assert wait_until(
            lambda: api(base, key, f"/api/v1/servers/{server['id']}")["state"] == "running", 60, 1
        ), running.log()[-4000:]
        agent = stack_process(running, "agent")
        assert agent is not None
        (model_server,) = children_of(agent)  # the demo's echo engine, in a session of its own
        databases = embedded_pids(home)

        # The worker: killed, started again, and it runs tasks again.
        seen_before = api(base, key, "/api/v1/system/status")["worker_seen_at"]
        worker = stack_process(running, "worker")
        assert worker is not None
        os.kill(worker, signal.SIGKILL)
        assert wait_until(lambda: "restarted the worker process" in running.log(), 30), running.log()[-4000:]
        assert (
            "the worker process exited with status -9 (SIGKILL); restarting it in 1 s (crash 1 of 5"
            in running.log()
        )
        assert stack_process(running, "worker") not in (None, worker)

        def worker_runs_the_probe() -> bool:
            api(base, key, "/api/v1/system/worker-probe", "POST")
            return api(base, key, "/api/v1/system/status")["worker_seen_at"] != seen_before

        assert wait_until(worker_runs_the_probe, 60, interval=2), running.log()[-4000:]

        # The web process (gunicorn's master, its worker left behind): killed, started again, it answers.
        web = stack_process(running, "web")
        assert web is not None
        os.kill(web, signal.SIGKILL)
        assert wait_until(lambda: "restarted the web process" in running.log(), 30), running.log()[-4000:]
        assert wait_until(lambda: http_ok(base + "/readyz"), 60), running.log()[-4000:]
        assert stack_process(running, "web") not in (None, web)

        # The agent: killed, started again (it heartbeats again); its model server outlives it.
        os.kill(agent, signal.SIGKILL)
        assert wait_until(lambda: "restarted the agent process" in running.log(), 30), running.log()[-4000:]
        assert wait_until(lambda: running.log().count("the control plane calls back on") == 2, 60)
        assert wait_until(lambda: api(base, key, "/api/v1/nodes?liveness=online")["count"] == 1, 60, 1)
        assert alive(model_server)
        # The new agent adopted it (its pid and start time in servers.json of the state volume).
        assert wait_until(
            lambda: "adopted server" in running.log() and f"(pid {model_server} " in running.log(), 30
        )
        # No crash stopped anything else: the same embedded servers ran throughout.
        assert embedded_pids(home) == databases and all(alive(pid) for pid in databases)
        assert "stopping everything" not in running.log()
    finally:
        code = interrupt(running)
    log = running.log()
    assert_stopped_cleanly(code, log, home, base)
    # Ctrl-C stops the model server (its adopting agent stops it, as a clean stop of an agent does), and
    # only then the embedded servers.
    assert not alive(model_server)
    assert not any(alive(pid) for pid in databases)


def test_a_process_that_keeps_crashing_stops_everything_with_a_message_naming_it(tmp_path, stack_home):
    env, home, base = stack_env(stack_home, MODELFORGE_LOCAL_AGENT="false")
    running = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run.log")
    killed: list[int] = []
    try:
        assert wait_until(lambda: "ModelForge is running at" in running.log(), 180), running.log()[-4000:]
        databases = embedded_pids(home)
        worker = stack_process(running, "worker")
        assert worker is not None
        # beat dies as soon as it is up, five times within two minutes (1 + 2 + 4 + 8 s of back-off).
        for crash in range(1, 6):
            assert wait_until(lambda: stack_process(running, "beat") not in (None, *killed), 60), (
                running.log()[-4000:]
            )
            beat = stack_process(running, "beat")
            assert beat is not None
            os.kill(beat, signal.SIGKILL)
            killed.append(beat)
            if crash < 5:
                assert wait_until(logged(running, f"(crash {crash} of 5 within 120 s)"), 10)
        assert running.process.wait(60) == 1
    finally:
        interrupt(running)
    log = running.log()
    assert log.count("restarted the beat process") == 4
    assert (
        "modelforge: the beat process crashed 5 times within 120 s (last: status -9 (SIGKILL)); stopping "
        "everything. Its last lines:"
    ) in log
    assert "modelforge: stopped" in log
    # Everything stopped, the embedded servers last.
    assert not http_ok(base + "/healthz")
    assert not alive(worker)
    assert not any(alive(pid) for pid in databases)
    assert not (home / "postgres" / "data" / "postmaster.pid").exists()
    assert not (home / "redis" / "redis.pid").exists()


# --- The data folder: one run at a time; a run stops only what it started; derived ports -------------


def run_devstack(env: dict[str, str], timeout: float = 60):
    return run_command([PYTHON, "-m", "modelforge", "run"], env, timeout)


def test_a_second_run_on_the_same_data_folder_is_refused_naming_the_process_that_holds_it(stack_home):
    # Regression: a second make run reused the first's services and, on its way out, stopped them.
    env, home, _ = stack_env(stack_home)
    held = DataFolderLock(home)
    assert held.acquire() is None
    try:
        second = run_devstack(env)
    finally:
        held.release()
    assert second.returncode == 3, second.stdout + second.stderr
    assert "[DATA_FOLDER_IN_USE]" in second.stdout
    assert f"pid {os.getpid()}" in second.stdout and "started" in second.stdout
    assert "Traceback" not in second.stdout + second.stderr
    # Nothing touched: no secret made, no service started.
    assert not (home / "secrets").exists() and not (home / "redis").exists()


def test_a_run_stops_only_the_embedded_servers_it_started_never_ones_it_found_running(stack_home):
    env = {"MODELFORGE_DATABASE_URL": "postgres://elsewhere/db", "MODELFORGE_PORT": str(free_port())}
    first = EmbeddedStack.from_environment(stack_home, env)
    first.start(persistent=False)
    try:
        found = EmbeddedStack.from_environment(stack_home, env)
        found.start(persistent=False)
        assert found.started == set()
        redis = found.redis
        assert redis is not None
        pid = redis.pid()
        found.stop(only_started=True)
        assert pid is not None and alive(pid)
    finally:
        first.stop(only_started=True)
    assert not alive(pid)


def test_the_embedded_and_agent_ports_derive_from_the_web_port_and_explicit_settings_win(tmp_path):
    assert port_defaults({}) == port_defaults({"MODELFORGE_PORT": "8000"}) == (54329, 63799, 8471)
    assert port_defaults({"MODELFORGE_PORT": "9100"}) == (9101, 9102, 9103)
    stack = EmbeddedStack.from_environment(
        tmp_path, {"MODELFORGE_PORT": "9100", "MODELFORGE_EMBEDDED_REDIS_PORT": "6400"}
    )
    assert (stack.pg_port, stack.redis_port) == (9101, 6400)
    with pytest.raises(EmbeddedStackError, match=r"\[INVALID_SETTING\] MODELFORGE_PORT"):
        port_defaults({"MODELFORGE_PORT": "65534"})


def test_an_embedded_service_found_gone_is_started_again_after_a_back_off(stack_home, capsys):
    env = {"MODELFORGE_DATABASE_URL": "postgres://elsewhere/db", "MODELFORGE_PORT": str(free_port())}
    stack = EmbeddedStack.from_environment(stack_home, env)
    stack.start(persistent=False)
    supervisor = quick_supervisor()
    watch = ServiceWatch(stack, supervisor)
    try:
        assert stack.redis is not None
        pid = stack.redis.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        endings: list[Ending] = []
        assert wait_until(
            lambda: bool(watch.check() and endings.append(1)) or stack.redis.pid() not in (None, pid),
            10,
            0.05,
        )
        assert endings == []
        out = capsys.readouterr().out
        assert (
            f"the embedded Redis (pid {pid}) is gone; restarting it in 0.2 s (loss 1 of 4 within 60 s)" in out
        )
        assert "restarted the embedded Redis" in out
    finally:
        stack.stop(only_started=True)


@pytest.mark.parametrize("moment", ["first-moment", "start-up", "migrate"])
def test_ctrl_c_at_any_moment_of_start_up_stops_cleanly_and_says_interrupted(tmp_path, stack_home, moment):
    # Regression: Ctrl-C in the first second was ignored; during migrate it printed a traceback.
    env, home, _ = stack_env(stack_home, MODELFORGE_LOCAL_AGENT="false", MODELFORGE_DEMO="false")
    running = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run.log")
    if moment == "first-moment":  # while Python is still importing: before any handler of ours
        time.sleep(0.15)
    elif moment == "start-up":  # the first thing it says, before the embedded services start
        assert wait_until(logged(running, "modelforge: data folder"), 30), running.log()[-3000:]
    else:
        assert wait_until(logged(running, "modelforge: migrating the database"), 120), running.log()[-3000:]
    code = interrupt(running)
    log = running.log()
    assert code == 0, log[-3000:]
    assert "modelforge: interrupted" in log and "modelforge: stopped" in log
    assert "Traceback" not in log and "a set-up step failed" not in log
    assert "ModelForge is running" not in log
    assert not (home / "postgres" / "data" / "postmaster.pid").exists()
    assert not (home / "redis" / "redis.pid").exists()


# --- A killed make run: nothing it started outlives it; the next run stops what a dead one left -------


def descendants(root: int) -> dict[int, list[str]]:
    """Every live process below ``root`` (children, their children, ...), with its command line."""
    found: dict[int, list[str]] = {}
    parents = [root]
    while parents:
        below = children_of(parents.pop())
        found.update(below)
        parents.extend(below)
    return found


def guardian_of(running) -> int | None:
    """The pid of the run's guardian (it stops the run's processes when the run dies), if it runs."""
    pids = [pid for pid, argv in children_of(running.process.pid).items() if "modelforge.devguard" in argv]
    return pids[0] if pids else None


def test_a_killed_run_leaves_nothing_running_and_the_next_run_stops_what_a_dead_one_left(
    tmp_path, stack_home
):
    # Regression: kill -9 of make run left web, worker, beat and the agent serving; the next run's web
    # crash-looped on the port the orphaned one held.
    env, home, base = stack_env(stack_home, MODELFORGE_DEMO="true")
    first = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run.log")
    try:
        assert wait_until(logged(first, "or, in Python (pip install openai):"), 300), first.log()[-4000:]
        left = descendants(first.process.pid)
        for role in ("web", "worker", "beat", "agent"):
            assert stack_process(first, role) is not None, role
        agent = stack_process(first, "agent")
        assert agent is not None
        (model_server,) = children_of(agent)
        databases = embedded_pids(home)
        # A dead run's guardian too (the OOM killer, or kill -9 of everything): its processes are left for
        # the next run to find.
        guardian = guardian_of(first)
        if guardian is not None:
            os.kill(guardian, signal.SIGKILL)
            left.pop(guardian)
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        assert all(alive(pid) for pid in left)  # what the next run must find and stop
    except BaseException:
        interrupt(first)
        raise

    second = start_process([PYTHON, "-m", "modelforge", "run"], env, tmp_path / "run-again.log")
    try:
        assert wait_until(logged(second, "ModelForge is running at"), 180), second.log()[-4000:]
        log = second.log()
        stopped = next(line for line in log.splitlines() if "stopped what the last run" in line)
        for pid in left:
            assert f"{pid}" in stopped, (pid, left[pid], stopped)
        for role in ("web", "worker", "beat", "agent", "model server"):
            assert role in stopped, (role, stopped)
        assert not any(alive(pid) for pid in left)
        assert "Address already in use" not in log and "restarted the web process" not in log
        # The embedded services are the data folder's: the killed run left them, this one uses them.
        assert embedded_pids(home) == databases
        assert wait_until(logged(second, "or, in Python (pip install openai):"), 180), second.log()[-4000:]
        credential = (home / "secrets" / "demo-client-credential").read_text().strip()
        assert ask_the_demo(base, credential) == "echo: hello"
        assert not alive(model_server)

        # The second run killed the same way, its guardian alive: within 5 s none of its processes run.
        assert guardian_of(second) is not None
        agent = stack_process(second, "agent")
        assert agent is not None and len(children_of(agent)) == 1  # the demo's model server, again
        ours = descendants(second.process.pid)
        os.killpg(second.process.pid, signal.SIGKILL)
        second.process.wait(10)
        assert wait_until(lambda: not any(alive(pid) for pid in ours), 5), {
            pid: argv for pid, argv in ours.items() if alive(pid)
        }
        guarded = f"modelforge: the make run (pid {second.process.pid}) ended without stopping its processes"
        assert wait_until(logged(second, guarded), 5), second.log()[-3000:]
        said = next(line for line in second.log().splitlines() if guarded in line)
        for role in ("web", "worker", "beat", "agent", "model server"):
            assert role in said, (role, said)
        assert not http_ok(base + "/healthz")
        assert all(alive(pid) for pid in databases)
    finally:
        interrupt(second)
        for pid in left:  # a failure here must not leave the first run's processes behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        run_command([PYTHON, "-m", "modelforge", "down"], env, 60)
    assert not any(alive(pid) for pid in databases)


SLEEPER = "import time; time.sleep(60)"


def test_a_run_stops_only_what_carries_its_mark_and_what_runs_in_the_sessions_they_lead():
    run, other = devguard.new_mark(), devguard.new_mark()
    # The leader's child drops its environment (a process title written over it would too): it is still
    # found, by the session its marked leader leads.
    leader = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import subprocess, sys\n"
            f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], env={{}})\n{SLEEPER}",
        ],
        env=process_env(**{devguard.MARK: f"{run}:web"}),
        start_new_session=True,
    )
    stranger = subprocess.Popen(
        [PYTHON, "-c", SLEEPER], env=process_env(**{devguard.MARK: f"{other}:web"}), start_new_session=True
    )
    try:
        assert wait_until(lambda: len(children_of(leader.pid)) == 1, 10)
        (child,) = children_of(leader.pid)
        assert devguard.marked(run) == {leader.pid: "web", child: "web"}
        stopped = devguard.stop(run, grace=1)
        assert devguard.describe(stopped) == f"web (pid {', '.join(map(str, sorted((leader.pid, child))))})"
        leader.wait(5)
        assert wait_until(lambda: not alive(child), 5)
        assert stranger.poll() is None
    finally:
        for process in (leader, stranger):
            process.kill()
            process.wait()


def test_the_guardian_stops_a_killed_runs_processes_and_says_which():
    run = devguard.new_mark()
    supervisor = subprocess.Popen(
        [
            PYTHON,
            "-c",
            "import os, subprocess, sys, time\n"
            "from modelforge import devguard\n"
            "guardian = devguard.Guardian(sys.argv[1])\n"
            "env = {**os.environ, devguard.MARK: sys.argv[1] + ':worker'}\n"
            f"subprocess.Popen([sys.executable, '-c', {SLEEPER!r}], env=env, start_new_session=True)\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n",
            run,
        ],
        env=process_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert supervisor.stdout is not None and supervisor.stdout.readline() == "up\n"
        (worker,) = devguard.marked(run)
        supervisor.kill()  # SIGKILL: nothing of ours runs in it any more
        supervisor.wait()
        assert wait_until(lambda: not alive(worker), 5)
        said = supervisor.stdout.read()  # the guardian's line; the end once the guardian has exited
        assert said == (
            f"modelforge: the make run (pid {supervisor.pid}) ended without stopping its processes; "
            f"stopped worker (pid {worker})\n"
        )
    finally:
        supervisor.kill()
        for pid in devguard.marked(run):
            os.kill(pid, signal.SIGKILL)
