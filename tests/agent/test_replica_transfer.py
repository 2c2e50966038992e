"""The agent's replica download over real HTTP on 127.0.0.1: a connection dropped mid-body leaves the
part file, the next attempt resumes with Range and the digest covers the whole file; a wrong digest is
discarded and never placed; BLAKE3 verifies where the record has one, SHA-256 where it has not, and a
file with neither is refused before anything is copied."""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import blake3
import pytest

from agent import transfer
from agent.replicas import FAILED, PRESENT, ReplicaManager

DATA = os.urandom(transfer.BUFFER * 2 + 12345)


class Served:
    def __init__(self) -> None:
        self.drop_after: int | None = None
        self.flip_at: int | None = None  # one byte of the body corrupted in transit
        self.ranges: list[str | None] = []
        self.authorizations: list[str | None] = []


@pytest.fixture
def served() -> Iterator[tuple[Served, str]]:
    state = Served()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            state.ranges.append(self.headers.get("Range"))
            state.authorizations.append(self.headers.get("Authorization"))
            start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get("Range") else 0
            body = DATA[start:]
            if state.flip_at is not None:
                at = state.flip_at - start
                body = body[:at] + bytes([body[at] ^ 0x01]) + body[at + 1 :]
            self.send_response(206 if start else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if state.drop_after is not None:
                self.wfile.write(body[: state.drop_after])
                self.wfile.flush()
                state.drop_after = None
                self.close_connection = True
                return
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


SHA256 = hashlib.sha256(DATA).hexdigest()
BLAKE3 = blake3.blake3(DATA).hexdigest()


def spec(sha256: str, **digests: str) -> dict[str, object]:
    return {
        "replica_id": "r1",
        "name": "weights",
        "base_url": "/files",
        "files": [{"path": "model.safetensors", "size": len(DATA), "sha256": sha256, **digests}],
    }


def settle(manager: ReplicaManager) -> str:
    deadline = time.monotonic() + 20
    replica = manager.get("r1")
    while replica is not None and replica.state == "copying" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert replica is not None
    return replica.state


def test_a_dropped_connection_leaves_the_part_and_the_retry_resumes_with_range(served, tmp_path: Path):
    state, url = served
    state.drop_after = transfer.BUFFER + 100
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec(hashlib.sha256(DATA).hexdigest()))
    assert settle(manager) == FAILED
    part = tmp_path / "models" / ".incoming" / "r1" / "model.safetensors.part"
    assert part.stat().st_size == transfer.BUFFER + 100  # everything received was kept
    assert not (tmp_path / "models" / "weights").exists()

    manager.start(spec(hashlib.sha256(DATA).hexdigest()))
    assert settle(manager) == PRESENT
    assert state.ranges == [None, f"bytes={transfer.BUFFER + 100}-"]
    assert set(state.authorizations) == {"Bearer node-credential"}
    placed = tmp_path / "models" / "weights" / "model.safetensors"
    assert placed.read_bytes() == DATA
    assert manager.get("r1").done == len(DATA)  # type: ignore[union-attr]


def test_a_part_holding_the_whole_file_is_verified_and_placed_without_a_request(served, tmp_path: Path):
    # An agent that died after the last byte was written but before the part was moved into place: a Range
    # from its length would be past the end (416) on every retry. What is on disk is verified instead.
    state, url = served
    incoming = tmp_path / "models" / ".incoming" / "r1"
    incoming.mkdir(parents=True)
    (incoming / "model.safetensors.part").write_bytes(DATA)
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec(SHA256, blake3=BLAKE3))
    assert settle(manager) == PRESENT
    assert state.ranges == []
    assert (tmp_path / "models" / "weights" / "model.safetensors").read_bytes() == DATA
    assert manager.get("r1").done == len(DATA)  # type: ignore[union-attr]


def test_a_part_longer_than_the_file_is_discarded_and_fetched_whole(served, tmp_path: Path):
    state, url = served
    incoming = tmp_path / "models" / ".incoming" / "r1"
    incoming.mkdir(parents=True)
    (incoming / "model.safetensors.part").write_bytes(DATA + b"left over")
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec(SHA256))
    assert settle(manager) == PRESENT
    assert state.ranges == [None]
    assert (tmp_path / "models" / "weights" / "model.safetensors").read_bytes() == DATA


def test_a_wrong_digest_is_discarded_and_never_placed(served, tmp_path: Path):
    _, url = served
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec("0" * 64))
    assert settle(manager) == FAILED
    assert "SHA-256 does not match" in manager.get("r1").reason  # type: ignore[union-attr]
    assert not (tmp_path / "models" / "weights").exists()
    assert not list((tmp_path / "models" / ".incoming" / "r1").glob("*.part"))


@pytest.mark.parametrize("where", [100, transfer.BUFFER + 7, len(DATA) - 1], ids=["first", "middle", "last"])
def test_a_byte_corrupted_in_transit_is_caught_by_the_blake3_and_never_placed(served, tmp_path: Path, where):
    state, url = served
    state.flip_at = where
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec(SHA256, blake3=BLAKE3))
    assert settle(manager) == FAILED
    reason = manager.get("r1").reason  # type: ignore[union-attr]
    assert reason == "model.safetensors: BLAKE3 does not match the artifact's record; discarded"
    assert not (tmp_path / "models" / "weights").exists()
    assert not list((tmp_path / "models" / ".incoming" / "r1").glob("*.part"))


def test_the_blake3_is_what_is_verified_when_the_record_has_one(served, tmp_path: Path):
    _, url = served
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    # A wrong BLAKE3 beside a right SHA-256 fails: the BLAKE3 is checked, not passed over for the other.
    manager.start(spec(SHA256, blake3="0" * 64))
    assert settle(manager) == FAILED
    assert "BLAKE3 does not match" in manager.get("r1").reason  # type: ignore[union-attr]
    manager.start(spec(SHA256, blake3=BLAKE3))
    assert settle(manager) == PRESENT
    assert (tmp_path / "models" / "weights" / "model.safetensors").read_bytes() == DATA


def test_a_resumed_transfer_is_verified_with_blake3_over_the_whole_file(served, tmp_path: Path):
    state, url = served
    state.drop_after = transfer.BUFFER + 100
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec(SHA256, blake3=BLAKE3))
    assert settle(manager) == FAILED
    manager.start(spec(SHA256, blake3=BLAKE3))
    assert settle(manager) == PRESENT
    assert state.ranges == [None, f"bytes={transfer.BUFFER + 100}-"]
    assert (tmp_path / "models" / "weights" / "model.safetensors").read_bytes() == DATA


def test_without_a_recorded_blake3_a_corrupted_byte_is_caught_by_the_sha256(served, tmp_path: Path):
    # An artifact acquired before BLAKE3s were recorded, or a control plane of an older release.
    state, url = served
    state.flip_at = transfer.BUFFER + 7
    manager = ReplicaManager(tmp_path / "models", "node-credential", url)
    manager.start(spec(SHA256))
    assert settle(manager) == FAILED
    reason = manager.get("r1").reason  # type: ignore[union-attr]
    assert reason == "model.safetensors: SHA-256 does not match the artifact's record; discarded"
    assert not (tmp_path / "models" / "weights").exists()


def test_the_reader_refuses_a_body_without_a_length(tmp_path: Path):
    import socket

    left, right = socket.socketpair()
    response = transfer.Response(200, {}, left, b"")
    with pytest.raises(RuntimeError, match="Content-Length"):
        response.pipe(lambda block: None)
    left.close()
    right.close()


def test_block_writer_writes_past_the_page_cache_while_aligned_and_plainly_for_the_tail(tmp_path: Path):
    from agent.replicas import BlockWriter

    body = os.urandom(3 * transfer.BUFFER + 4097)  # three whole buffers and an unaligned tail
    path = tmp_path / "weights.part"
    writer = BlockWriter(path, 0, len(body))
    assert writer.direct  # ext4 under the test's temporary directory takes O_DIRECT
    aligned = mmap.mmap(-1, transfer.BUFFER)  # page-aligned, as the reader's buffers are
    for offset in range(0, 3 * transfer.BUFFER, transfer.BUFFER):
        aligned[:] = body[offset : offset + transfer.BUFFER]
        writer.write(memoryview(aligned))
        assert writer.direct
    writer.write(memoryview(body)[3 * transfer.BUFFER :])
    assert not writer.direct  # the short last block went through the page cache
    writer.close()
    assert path.read_bytes() == body


def test_block_writer_resumes_at_an_unaligned_offset_with_plain_writes(tmp_path: Path):
    from agent.replicas import BlockWriter

    path = tmp_path / "weights.part"
    path.write_bytes(b"a" * 1000)
    writer = BlockWriter(path, 1000, 1000 + 5000)
    assert not writer.direct  # O_DIRECT needs whole blocks: the rest of this file is written plainly
    writer.write(memoryview(b"b" * 5000))
    writer.close()
    assert path.read_bytes() == b"a" * 1000 + b"b" * 5000
