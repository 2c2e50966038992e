"""The presence check: a weights directory, a single .gguf file, or a directory containing one.

Seeds (Troubleshooting): "that check understands a weights directory, a single .gguf file, or a
directory containing one, so a GGUF-only replica is correctly seen."
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.models import InvalidModelName, check_presence, models_present


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    root.mkdir()
    (root / "bge-m3").mkdir()
    (root / "bge-m3" / "model.safetensors").write_bytes(b"weights")
    (root / "bge-m3" / "config.json").write_text("{}")
    (root / "opt-125m").mkdir()
    (root / "opt-125m" / "pytorch_model.bin").write_bytes(b"weights")
    (root / "configured").mkdir()
    (root / "configured" / "config.json").write_text("{}")
    (root / "llama-3-8b-q4.gguf").write_bytes(b"GGUF")
    (root / "qwen-gguf").mkdir()
    (root / "qwen-gguf" / "qwen2.5-7b-q4_k_m.gguf").write_bytes(b"GGUF")
    (root / "qwen-gguf" / "README.md").write_text("")
    (root / "empty").mkdir()
    (root / "notes.txt").write_text("")
    (root / ".downloading").mkdir()
    (root / ".downloading" / "model.safetensors").write_bytes(b"partial")
    return root


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("bge-m3", "weights_directory"),
        ("opt-125m", "weights_directory"),
        ("configured", "weights_directory"),
        ("llama-3-8b-q4.gguf", "gguf_file"),
        ("qwen-gguf", "gguf_directory"),
    ],
)
def test_it_recognises_each_layout(models: Path, name: str, kind: str) -> None:
    presence = check_presence(models, name)

    assert presence.as_payload() == {"model": name, "present": True, "kind": kind}


@pytest.mark.parametrize("name", ["absent", "empty", "notes.txt"])
def test_anything_else_is_absent(models: Path, name: str) -> None:
    assert check_presence(models, name).as_payload() == {"model": name, "present": False, "kind": None}


def test_a_missing_models_directory_means_nothing_is_present(tmp_path: Path) -> None:
    assert check_presence(tmp_path / "nowhere", "bge-m3").present is False
    assert models_present(tmp_path / "nowhere") == []


@pytest.mark.parametrize(
    "name",
    ["..", "../secrets", "bge-m3/../../etc", "/etc/passwd", "a/b", "a\\b", ".", "", "  ", "x\x00y", 42, None],
)
def test_it_refuses_names_that_could_leave_the_models_directory(models: Path, name: object) -> None:
    with pytest.raises(InvalidModelName):
        check_presence(models, name)


def test_models_present_lists_each_model_once_by_name(models: Path) -> None:
    assert [(p.model, p.kind) for p in models_present(models)] == [
        ("bge-m3", "weights_directory"),
        ("configured", "weights_directory"),
        ("llama-3-8b-q4.gguf", "gguf_file"),
        ("opt-125m", "weights_directory"),
        ("qwen-gguf", "gguf_directory"),
    ]
