"""Runtime profiles: loaded from config/, validated strictly, every problem with its file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.servers.profiles import CONFIG_NOT_MOUNTED, INVALID_MANIFEST, load_profiles
from tests.fixtures import PYTHON, process_env, run_command

ROOT = Path(__file__).resolve().parents[3]


def write(config: Path, name: str, text: str) -> None:
    (config / "runtimes").mkdir(parents=True, exist_ok=True)
    (config / "runtimes" / name).write_text(text)


def test_the_shipped_profiles_are_valid():
    profiles, problems = load_profiles(ROOT / "config")
    assert problems == []
    assert {"test-echo", "test-echo-gpu", "vllm", "llamacpp-gguf"} <= set(profiles)
    assert profiles["llamacpp-gguf"].local_node_only is True
    need, rule = profiles["vllm"].memory_need(14 * 2**30, 2)
    assert need == int(1.3 * 7 * 2**30) + 2 * 2**30
    assert rule == "1.3 x 7.0 GiB of weights per GPU + 2.0 GiB overhead"


def test_every_problem_is_reported_with_file_and_field(tmp_path):
    write(
        tmp_path,
        "broken.toml",
        """
name = "broken"
engine = "tensorrt"
accelerator = "tpu"
colour = "blue"
[memory]
rule = "fixed"
per_gpu_gib = -1
[launch]
command = "serve"
args = ["--model", "{model_path}", "--gpus", "{gpu_list}"]
health_path = "health"
""",
    )
    write(
        tmp_path,
        "gguf.toml",
        """
name = "gguf"
engine = "llamacpp"
accelerator = "cpu"
local_node_only = false
[memory]
rule = "fixed"
per_gpu_gib = 1
[launch]
command = "x"
args = ["--port", "{port}"]
""",
    )
    write(tmp_path, "bad.toml", "name = [unclosed")
    profiles, problems = load_profiles(tmp_path)
    assert profiles == {}
    assert any("unknown placeholder(s) {gpu_list}" in p.message for p in problems)
    found = {(p.code, p.where.split("/")[-1]) for p in problems}
    assert {
        (INVALID_MANIFEST, "broken.toml: engine"),
        (INVALID_MANIFEST, "broken.toml: accelerator"),
        (INVALID_MANIFEST, "broken.toml: colour"),
        (INVALID_MANIFEST, "broken.toml: memory.per_gpu_gib"),
        (INVALID_MANIFEST, "broken.toml: launch.args"),
        (INVALID_MANIFEST, "broken.toml: launch.health_path"),
        (INVALID_MANIFEST, "gguf.toml: local_node_only"),
        (INVALID_MANIFEST, "bad.toml"),
    } <= found


def test_a_missing_or_empty_config_directory_is_named_as_not_mounted(tmp_path):
    for config in (tmp_path / "absent", tmp_path):
        profiles, problems = load_profiles(config)
        assert profiles == {}
        assert [(p.code, p.where) for p in problems] == [(CONFIG_NOT_MOUNTED, str(config / "runtimes"))]
        assert "not mounted or is empty" in problems[0].message


@pytest.mark.stack
def test_production_refuses_to_start_without_its_config(tmp_path):
    env = process_env(
        MODELFORGE_ENV="production",
        MODELFORGE_CONFIG_DIR=str(tmp_path / "nowhere"),
        MODELFORGE_SECRET_KEY="p" * 64,
        MODELFORGE_OPERATOR_API_KEY="o" * 40,
        MODELFORGE_CLUSTER_SECRET="c" * 32,
        MODELFORGE_ALLOWED_HOSTS="modelforge.example.org",
        MODELFORGE_DATABASE_URL="postgres://modelforge:Str0ng-and-long@127.0.0.1:1/modelforge",
        MODELFORGE_REDIS_URL="redis://127.0.0.1:1/0",
    )
    finished = run_command([PYTHON, "manage.py", "check"], env)
    assert finished.returncode == 3
    assert "ModelForge refused to start: 1 configuration problem(s) must be resolved." in finished.stderr
    assert (
        f"- [CONFIG_NOT_MOUNTED] {tmp_path / 'nowhere' / 'runtimes'}: holds no runtime profile"
        in finished.stderr
    )


def test_a_wrong_type_is_named_down_to_the_item_and_a_non_table_section_is_refused(tmp_path):
    write(
        tmp_path,
        "types.toml",
        """
name = "types"
engine = "test"
accelerator = "cpu"
local_node_only = "yes"
shm = 4
[memory]
rule = "weights_factor"
per_gpu_gib = true
overhead_gib = -2
[launch]
command = "x"
args = ["--port", "{port}", 3]
""",
    )
    profiles, problems = load_profiles(tmp_path)
    assert profiles == {}
    assert sorted((p.where.split("/")[-1], p.message) for p in problems) == [
        ("types.toml: launch.args[2]", "must be str, not int"),
        ("types.toml: local_node_only", "must be bool, not str"),
        ("types.toml: memory.overhead_gib", "must not be negative"),
        ("types.toml: memory.per_gpu_gib", "must be a number, not bool"),
        ("types.toml: shm", "must be a table, not int"),
    ]


def test_the_servers_app_loads_the_profiles_and_settings_import_no_app():
    from apps.servers.profiles import runtime_profiles

    assert {"test-echo", "vllm"} <= set(runtime_profiles())
    code = (
        "import sys, modelforge.settings; print(sorted(m for m in sys.modules if m.split('.')[0] == 'apps'))"
    )
    done = run_command([PYTHON, "-c", code], process_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.stack
def test_production_refuses_to_start_on_a_bad_manifest(tmp_path):
    write(tmp_path, "a.toml", (ROOT / "config" / "runtimes" / "test-echo.toml").read_text())
    write(tmp_path, "b.toml", 'name = "b"\nengine = "tensorrt"\n')
    env = process_env(
        MODELFORGE_ENV="production",
        MODELFORGE_CONFIG_DIR=str(tmp_path),
        MODELFORGE_SECRET_KEY="p" * 64,
        MODELFORGE_OPERATOR_API_KEY="o" * 40,
        MODELFORGE_CLUSTER_SECRET="c" * 32,
        MODELFORGE_ALLOWED_HOSTS="modelforge.example.org",
        MODELFORGE_DATABASE_URL="postgres://modelforge:Str0ng-and-long@127.0.0.1:1/modelforge",
        MODELFORGE_REDIS_URL="redis://127.0.0.1:1/0",
    )
    finished = run_command([PYTHON, "manage.py", "check"], env)
    assert finished.returncode == 3
    b = tmp_path / "runtimes" / "b.toml"
    assert f"- [INVALID_MANIFEST] {b}: engine: 'tensorrt' is not one of vllm, llamacpp" in finished.stderr
    assert f"- [INVALID_MANIFEST] {b}: launch.command: is required" in finished.stderr


def test_a_profile_declares_the_endpoints_its_engine_serves(tmp_path):
    profiles, _ = load_profiles(ROOT / "config")
    assert profiles["llamacpp-gemma-embeddings"].endpoints == {"/v1/embeddings"}
    assert profiles["llamacpp-gemma"].endpoints == {"/v1/chat/completions", "/v1/completions"}
    assert profiles["test-echo"].endpoints == {"/v1/chat/completions", "/v1/embeddings"}
    base = """
name = "{name}"
engine = "{engine}"
accelerator = "cpu"
{endpoints}
[memory]
rule = "fixed"
per_gpu_gib = 1
[launch]
command = "x"
args = ["--port", "{{port}}"]
ready_check = "{check}"
"""
    cases = {
        "unset.toml": ("unset", "embeddings", "", "embeddings"),
        "wrong.toml": ("wrong", "vllm", 'endpoints = ["chat", "images"]', "chat"),
        "empty.toml": ("empty", "vllm", "endpoints = []", "none"),
        "unproven.toml": ("unproven", "vllm", 'endpoints = ["completions"]', "chat"),
    }
    for file, (name, engine, endpoints, check) in cases.items():
        write(tmp_path, file, base.format(name=name, engine=engine, endpoints=endpoints, check=check))
    profiles, problems = load_profiles(tmp_path)
    # Unset: the engine's default (ENGINE_ENDPOINTS), here an embeddings engine's one endpoint.
    assert set(profiles) == {"unset"} and profiles["unset"].endpoints == {"/v1/embeddings"}
    found = {p.where.split("/")[-1]: p.message for p in problems}
    assert found["wrong.toml: endpoints[1]"] == "'images' is not one of chat, completions, embeddings"
    assert found["empty.toml: endpoints"].startswith("must name at least one of")
    proven = "must include 'chat': launch.ready_check proves the model with it"
    assert found["unproven.toml: endpoints"] == proven


def test_a_profile_may_limit_the_requests_its_servers_take_at_once(tmp_path):
    base = """
name = "{name}"
engine = "vllm"
accelerator = "cpu"
{limit}
[memory]
rule = "fixed"
per_gpu_gib = 1
[launch]
command = "x"
args = ["--port", "{{port}}"]
"""
    cases = {
        "unset.toml": "",
        "eight.toml": "max_concurrent = 8",
        "zero.toml": "max_concurrent = 0",
        "huge.toml": "max_concurrent = 10001",
        "text.toml": 'max_concurrent = "8"',
        "decimal.toml": "max_concurrent = 1.5",
        "yes.toml": "max_concurrent = true",
    }
    for file, limit in cases.items():
        write(tmp_path, file, base.format(name=file.removesuffix(".toml"), limit=limit))
    profiles, problems = load_profiles(tmp_path)
    # Unset: no limit at the gateway; set: carried on the profile (and on each of its servers' backends).
    assert set(profiles) == {"unset", "eight"}
    assert profiles["unset"].max_concurrent is None and profiles["eight"].max_concurrent == 8
    found = {p.where.split("/")[-1]: p.message for p in problems}
    assert {p.code for p in problems} == {INVALID_MANIFEST}
    bounds = "must be a whole number from 1 to 10000 (leave it out for no limit)"
    assert found == {
        "zero.toml: max_concurrent": bounds,
        "huge.toml: max_concurrent": bounds,
        "text.toml: max_concurrent": "must be a whole number, not str",
        "decimal.toml: max_concurrent": "must be a whole number, not float",
        "yes.toml: max_concurrent": "must be a whole number, not bool",
    }
