"""``make run``'s demo: a request served in the first minutes.

Through the operator API, idempotently: the ``demo-echo`` server (test-echo profile, the ``echo-demo``
model folder of the local agent) on the local node, the ``demo`` cluster with it attached, the capability
``demo.echo@1`` routed to that cluster, and a client credential kept in
``<home>/secrets/demo-client-credential`` (0600). Then one request through the gateway, and the ``curl``
and ``openai`` lines that make it. ``MODELFORGE_DEMO=false`` leaves it out.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

CAPABILITY = "demo.echo@1"
SERVER = "demo-echo"
CLUSTER = "demo"
MEMBER = "echo-1"


class DemoError(RuntimeError):
    """A demo step failed; the message says which."""


class Api:
    """The operator API over HTTP, as an operator would call it."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base.rstrip("/"), key

    def call(self, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(  # noqa: S310 -- our own loopback URL
            self.base + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:  # noqa: S310 -- our loopback URL
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise DemoError(
                f"{method} {path}: {exc.code} {exc.read()[:300].decode(errors='replace')}"
            ) from exc
        return json.loads(raw) if raw else None

    def find(self, path: str, **match: Any) -> dict[str, Any] | None:
        for row in self.call(path + ("&" if "?" in path else "?") + "limit=500")["results"]:
            if all(row.get(name) == value for name, value in match.items()):
                return dict(row)
        return None


def _until(check: Callable[[], bool], timeout: float, stop: threading.Event, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if stop.is_set():
            raise DemoError("interrupted")
        if time.monotonic() > deadline:
            raise DemoError(f"{what} did not happen within {timeout:g} s")
        time.sleep(1)


def _credential(api: Api, secrets_dir: Path) -> str:
    path = secrets_dir / "demo-client-credential"
    if path.exists():
        return path.read_text().strip()
    minted = api.call(
        "/api/v1/client-credentials", "POST", {"name": "demo (make run)", "scopes": [CAPABILITY]}
    )
    secrets_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(minted["credential"] + "\n")
    return str(minted["credential"])


def ensure_demo(base: str, key: str, home: Path, node: str, stop: threading.Event) -> list[str]:
    """Create what is missing, wait until the demo answers, and return the lines that call it.

    1. The local node online; the ``demo-echo`` server on it (a failed one restarted, a stopped one
       replaced by a new one).
    2. The ``demo`` cluster, its member ``echo-1`` with that server attached.
    3. The capability, a tier routing it to the cluster, the credential (kept, never minted twice).
    4. The server running, then one real chat completion through the gateway.
    """
    api = Api(base, key)
    _until(
        lambda: api.find("/api/v1/nodes?liveness=online", name=node) is not None, 90, stop, "the node online"
    )
    server = api.find(f"/api/v1/servers?node={node}", name=SERVER)
    if server is not None and server["state"] == "stopped":
        api.call(f"/api/v1/servers/{server['id']}", "DELETE")
        server = None
    if server is None:
        server = api.call(
            "/api/v1/servers",
            "POST",
            {"name": SERVER, "profile": "test-echo", "model": "echo-demo", "node": node},
        )
    elif server["state"] == "failed":
        server = api.call(f"/api/v1/servers/{server['id']}/restart", "POST")
    assert server is not None
    cluster = api.find("/api/v1/clusters", name=CLUSTER) or api.call(
        "/api/v1/clusters", "POST", {"name": CLUSTER}
    )
    member = next((m for m in cluster["members"] if m["name"] == MEMBER), None)
    if member is None:
        member = api.call(
            "/api/v1/cluster-members",
            "POST",
            {"cluster": cluster["id"], "name": MEMBER, "gpus": 0, "weight": 1},
        )
    if member["server"] != server["id"]:
        api.call(f"/api/v1/cluster-members/{member['id']}/attach", "POST", {"server": server["id"]})
    capability = api.find("/api/v1/capabilities", name=CAPABILITY) or api.call(
        "/api/v1/capabilities",
        "POST",
        {"name": CAPABILITY, "description": "make run's demo: the echo engine"},
    )
    if api.find("/api/v1/routing-tiers", capability=capability["id"], cluster=cluster["id"]) is None:
        api.call(
            "/api/v1/routing-tiers",
            "POST",
            {"capability": capability["id"], "tier": 0, "cluster": cluster["id"]},
        )
    credential = _credential(api, home / "secrets")
    _until(
        lambda: api.call(f"/api/v1/servers/{server['id']}")["state"] == "running",
        120,
        stop,
        "the demo server running",
    )
    body = {"model": CAPABILITY, "messages": [{"role": "user", "content": "hello"}]}

    def answered() -> bool:
        request = urllib.request.Request(  # noqa: S310 -- our own loopback URL
            base.rstrip("/") + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {credential}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 -- our loopback URL
                return bool(response.status == 200)
        except OSError:  # the gateway's routing table catches up within seconds
            return False

    _until(answered, 60, stop, "a first answer through the gateway")
    path = home / "secrets" / "demo-client-credential"
    v1 = base.rstrip("/") + "/v1"
    return [
        f"demo: {CAPABILITY} is served by the echo engine on {node} (server {SERVER}, cluster {CLUSTER}); "
        f"its client credential is in {path}",
        "call it:",
        f'    curl -s {v1}/chat/completions -H "Authorization: Bearer $(cat {path})" '
        f"-H 'Content-Type: application/json' "
        f'-d \'{{"model": "{CAPABILITY}", "messages": [{{"role": "user", "content": "hello"}}]}}\'',
        "or, in Python (pip install openai):",
        "    from openai import OpenAI",
        f"    client = OpenAI(base_url={v1!r}, api_key=open({str(path)!r}).read().strip())",
        f"    print(client.chat.completions.create(model={CAPABILITY!r}, "
        "messages=[{'role': 'user', 'content': 'hello'}]).choices[0].message.content)",
    ]


def start_demo(
    url: str, home: Path, env: dict[str, str], say: Callable[[str], None], stop: threading.Event
) -> threading.Thread:
    """Run ``ensure_demo`` beside the supervision loop (it waits minutes at most, never blocks Ctrl-C)."""
    key = (
        (home / "secrets" / "operator-api-key").read_text().strip()
        if not env.get("MODELFORGE_OPERATOR_API_KEY")
        else env["MODELFORGE_OPERATOR_API_KEY"]
    )

    def work() -> None:
        try:
            lines = ensure_demo(url, key, home, env["MODELFORGE_AGENT_NAME"], stop)
        except (DemoError, OSError, KeyError, ValueError) as exc:
            if not stop.is_set():
                say(f"the demo could not be set up ({exc}); MODELFORGE_DEMO=false leaves it out")
            return
        for line in lines:
            say(line)

    thread = threading.Thread(target=work, name="demo", daemon=True)
    thread.start()
    return thread
