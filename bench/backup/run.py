"""Backup and verification of a control-plane database against PostgreSQL's raw tools.

    .venv/bin/python bench/backup/run.py               # a 1 GB database
    .venv/bin/python bench/backup/run.py --size-mb 200 # a quick look

1. A throw-away PostgreSQL 16 (the embedded wheel), migrated; authoritative tables (node events, alerts,
   server events) filled with generated rows to the asked size.
2. Raw: ``pg_dump -Fc`` then ``sha256sum`` of its file; ``createdb`` + ``pg_restore`` of that file (the
   same --jobs ModelForge uses).
3. ModelForge: ``snapshot.take`` (snapshot export, dump, row counts in the same snapshot, hash, manifest)
   and ``verification.verify`` (digests, scratch database, restore, invariants, row counts, drop), in this
   process, timed around the calls.
Each pair runs ``--rounds`` times alternating, and the medians are compared. Targets: backup <= 1.2x raw,
verification <= 1.3x raw.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import interpreter, throwaway_stack


def fill(size_mb: int) -> None:
    """Generated rows in authoritative tables until the database is about ``size_mb`` MB."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO nodes_node (id, name, accelerator, enabled, liveness, enrolled_at, credential_hash, "
            "agent_version, agent_url, models_present, agent_error) SELECT gen_random_uuid(), 'bench-' || i, "
            "'cpu', true, 'online', now(), encode(sha256(i::text::bytea), 'hex'), '', '', '[]', '' "
            "FROM generate_series(1, 1000) AS i"
        )
        batch = 200_000
        while True:
            cursor.execute("SELECT pg_database_size(current_database())")
            if cursor.fetchone()[0] >= size_mb * 1_000_000:
                break
            cursor.execute(
                "WITH n AS (SELECT array_agg(id) AS ids FROM nodes_node) "
                "INSERT INTO nodes_nodeevent (node_id, kind, from_liveness, to_liveness, at, detail) "
                "SELECT n.ids[1 + i %% 1000], 'liveness', 'online', 'stale', now() - (i || ' s')::interval, "
                "'missed heartbeats: ' || md5(i::text) || ' ' || md5((i * 7)::text) || ' last seen ' || "
                "(now() - (i || ' s')::interval)::text FROM n, generate_series(1, %s) AS i",
                [batch],
            )
            cursor.execute(
                "INSERT INTO alerts_alert (code, severity, subject_type, subject_id, subject_name, "
                "dedup_key, message, raised_at, last_raised_at, occurrences, cleared_at) "
                "SELECT 'NODE_STALE', 'warning', 'node', i::text, 'bench-' || i, md5(random()::text), "
                "'Node bench-' || i || ' missed three heartbeats; ' || md5(i::text), "
                "now(), now(), 1, now() FROM generate_series(1, %s) AS i",
                [batch // 4],
            )
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        print(f"database size: {cursor.fetchone()[0]}", flush=True)


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"interpreter: {interpreter()}")
    with throwaway_stack() as (workdir, _env):
        from django.conf import settings

        from apps.backups import pgtools, snapshot, verification
        from apps.backups.models import Backup

        root = workdir / "backups"
        root.mkdir()
        settings.BACKUP_ROOT = root
        settings.BACKUP_KEEP_DAYS = 0
        fill(args.size_mb)
        server = pgtools.service_server()
        env = server.libpq_env()
        raw_file = workdir / "raw.dump"
        results: dict[str, list[float]] = {k: [] for k in ("raw_dump", "raw_restore", "backup", "verify")}
        for round_number in range(1, args.rounds + 1):
            dump_s = timed(
                [pgtools.tool("pg_dump"), "--format=custom", f"--file={raw_file}", server.database], env
            )
            dump_s += timed(["sha256sum", str(raw_file)], env)
            results["raw_dump"].append(dump_s)
            pgtools.drop_database(server, "bench_raw_restore")
            started = time.perf_counter()
            pgtools.create_database(server, "bench_raw_restore")
            pgtools.pg_restore(server, raw_file, "bench_raw_restore")
            results["raw_restore"].append(time.perf_counter() - started)
            pgtools.drop_database(server, "bench_raw_restore")
            raw_file.unlink()

            backup = snapshot.request_backup(trigger="operator", by="bench")
            started = time.perf_counter()
            state = snapshot.take(backup.pk)
            results["backup"].append(time.perf_counter() - started)
            assert state == "completed", Backup.objects.get(pk=backup.pk).reason_message
            started = time.perf_counter()
            state = verification.verify(backup.pk)
            results["verify"].append(time.perf_counter() - started)
            assert state == "verified", Backup.objects.get(pk=backup.pk).reason_message
            size = Backup.objects.get(pk=backup.pk).size_bytes
            print(
                f"round {round_number}: raw dump+sha256 {dump_s:.2f} s, "
                f"backup {results['backup'][-1]:.2f} s; "
                f"raw pg_restore {results['raw_restore'][-1]:.2f} s, verify {results['verify'][-1]:.2f} s "
                f"(dump {size / 1e6:.0f} MB)",
                flush=True,
            )
            snapshot.prune()  # keeps the disk from filling across rounds

        med = {k: statistics.median(v) for k, v in results.items()}
        print()
        print(f"{'':28}{'raw (s)':>10}{'ModelForge (s)':>16}{'ratio':>8}{'target':>8}")
        print(
            f"{'backup (dump + sha256)':28}{med['raw_dump']:>10.2f}{med['backup']:>16.2f}"
            f"{med['backup'] / med['raw_dump']:>8.2f}{'<= 1.2':>8}"
        )
        print(
            f"{'verification (pg_restore)':28}{med['raw_restore']:>10.2f}{med['verify']:>16.2f}"
            f"{med['verify'] / med['raw_restore']:>8.2f}{'<= 1.3':>8}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
