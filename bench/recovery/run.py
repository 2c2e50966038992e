"""The recovery drill, both variants, against real processes: a restore under traffic, and a control-plane
outage longer than the offline limit.

    .venv/bin/python bench/recovery/run.py                       # both variants, 1 web worker
    .venv/bin/python bench/recovery/run.py --web-workers 2 --variants restore

1. PostgreSQL 16 and Redis: the embedded stack in a temporary folder, on free ports (as ``make test``
   does), unless ``MODELFORGE_DATABASE_URL`` / ``MODELFORGE_REDIS_URL`` are set: then those servers are
   used (a fresh database per variant on that PostgreSQL, Redis database ``--redis-db``, flushed).
2. Each variant: ``bench/recovery/scenario.run_scenario`` on a fresh database (dropped afterwards, with
   the databases a restore keeps beside it).
3. A table of the figures, and the targets: no server process stopped, no node taken offline, failed
   requests no more than those in flight at the switch-over, every request answered 200 again soon
   after. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.recovery.scenario import VARIANTS, create_database, drop_databases, free_port, run_scenario
from modelforge.embedded import EmbeddedStack

ROWS = [
    ("requests_total", "gateway requests"),
    ("requests_failed", "  failed (not 200)"),
    ("in_flight_at_switch", "  in flight at the switch-over / the stop"),
    ("in_flight_during_switch", "  in flight during the switch-over / outage"),
    ("failed_after_switch_5s", "  failed from 5 s after it"),
    ("recovery_s", "  s until every request is 200 again"),
    ("servers_running_before", "server processes running before"),
    ("servers_stopped", "  stopped"),
    ("servers_failed", "servers failed in the books"),
    ("nodes_offline", "nodes taken offline"),
    ("stale_events", "node stale events"),
    ("mass_loss_alerts", "NODE_MASS_LOSS alerts"),
    ("late_server_recorded", "fifth server in the books"),
    ("late_server_recorded_s", "  s after the switch-over"),
    ("api_calls", "operator API calls"),
    ("api_5xx_after_switch", "  5xx after the switch-over / restart"),
    ("restore_s", "restore, s (all phases)"),
    ("switch_window_s", "switch-over window, s"),
    ("rpo_s", "measured RPO, s"),
    ("down_s", "control plane down, s"),
    ("control_offline_s", "control: a stopped agent offline after, s"),
]


def missed_targets(figures: dict[str, Any]) -> list[str]:
    """What the drill promises, checked on one variant's figures."""
    missed = []
    if figures["servers_stopped"]:
        missed.append(f"{figures['servers_stopped']} server process(es) stopped")
    if figures["nodes_offline"]:
        missed.append(f"{figures['nodes_offline']} node(s) taken offline")
    if figures["servers_failed"]:
        missed.append(f"{figures['servers_failed']} server(s) failed in the books")
    if not figures["late_server_recorded"]:
        missed.append("the fifth server is not in the books")
    if figures["api_5xx_after_switch"]:
        missed.append(f"{figures['api_5xx_after_switch']} API 5xx after the switch-over")
    if figures["failed_after_switch_5s"]:
        missed.append(f"{figures['failed_after_switch_5s']} requests failed from 5 s after the switch-over")
    if figures["variant"] == "restore" and figures["requests_failed"] > figures["in_flight_during_switch"]:
        missed.append(
            f"{figures['requests_failed']} requests failed, more than the "
            f"{figures['in_flight_during_switch']} in flight at the switch-over"
        )
    return missed


def print_table(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print()
    print(f"{'':46}" + "".join(f"{name:>12}" for name in names))
    for key, label in ROWS:
        if not any(key in results[name] for name in names):
            continue
        cells = []
        for name in names:
            value = results[name].get(key, "")
            cells.append(f"{'yes' if value is True else 'no' if value is False else value:>12}")
        print(f"{label:46}" + "".join(cells))
    print()
    for name in names:
        print(f"{name}: {results[name]['thresholds']}")


def _redis_database(url: str, number: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{number}", parts.query, parts.fragment))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="restore,outage")
    parser.add_argument("--web-workers", type=int, default=1)
    parser.add_argument("--rate", type=float, default=30.0, help="gateway requests per second")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds of traffic after the event")
    parser.add_argument(
        "--redis-db", type=int, default=11, help="with MODELFORGE_REDIS_URL: the database used"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in variants:
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}")

    workdir = Path(tempfile.mkdtemp(prefix="mf-recovery-"))
    workdir.chmod(0o755)  # the embedded PostgreSQL runs as an unprivileged user when we are root
    environ = dict(os.environ)
    environ.setdefault("MODELFORGE_EMBEDDED_PG_PORT", str(free_port()))
    environ.setdefault("MODELFORGE_EMBEDDED_REDIS_PORT", str(free_port()))
    stack = EmbeddedStack.from_environment(workdir / "services", environ)
    results: dict[str, dict[str, Any]] = {}
    try:
        urls = stack.start(persistent=False)
        database_url = urls.get("MODELFORGE_DATABASE_URL") or environ["MODELFORGE_DATABASE_URL"]
        redis_url = urls.get("MODELFORGE_REDIS_URL") or _redis_database(
            environ["MODELFORGE_REDIS_URL"], args.redis_db
        )
        for variant in variants:
            url = create_database(database_url, f"mf_recovery_{variant}_{os.getpid()}")
            try:
                results[variant] = run_scenario(
                    workdir / variant,
                    database_url=url,
                    redis_url=redis_url,
                    variant=variant,
                    web_workers=args.web_workers,
                    rate=args.rate,
                    settle_s=args.settle,
                )
            finally:
                drop_databases(url)
    finally:
        stack.destroy()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(results)
    if args.keep:
        print(f"logs: {workdir}/<variant>/logs")
    code = 0
    for variant, figures in results.items():
        missed = missed_targets(figures)
        print(f"{variant}: {'targets met' if not missed else 'MISSED: ' + '; '.join(missed)}")
        code = code or (1 if missed else 0)
    print(json.dumps(results, default=str), file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
