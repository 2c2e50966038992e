"""The request path's modules compiled by Cython (modelforge/compiled.py): imported compiled only while built
from the source as it is; a stale build runs as source and is warned about (gateway.W001)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from apps.gateway.checks import compiled_modules
from modelforge import compiled

PROBE = "mfprobe.twice"


@pytest.fixture
def probe_tree(tmp_path: Path):
    """A package of one module, compiled for real into tmp_path/build, importable from tmp_path."""
    package = tmp_path / "mfprobe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "twice.py").write_text("def twice(x):\n    return 2 * x\n")
    compiled.build([PROBE], root=tmp_path, out=tmp_path / "build", jobs=1)
    finder = compiled.CompiledFinder(root=tmp_path, build=tmp_path / "build", modules=[PROBE])
    sys.path.insert(0, str(tmp_path))
    sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        yield tmp_path, finder
    finally:
        sys.meta_path.remove(finder)  # type: ignore[arg-type]
        sys.path.remove(str(tmp_path))
        for name in ("mfprobe.twice", "mfprobe"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()


def test_a_module_built_from_its_source_is_imported_compiled(probe_tree):
    root, finder = probe_tree
    module = importlib.import_module(PROBE)
    assert module.__file__ == str(root / "build" / "mfprobe" / f"twice{compiled.SUFFIX}")
    assert module.twice(21) == 42
    assert finder.loaded == [PROBE] and finder.stale == []
    assert compiled.stale(root, root / "build", [PROBE]) == []


def test_a_source_changed_after_its_build_runs_as_source(probe_tree):
    root, finder = probe_tree
    (root / "mfprobe" / "twice.py").write_text("def twice(x):\n    return x + x + 1\n")
    module = importlib.import_module(PROBE)
    assert module.__file__ == str(root / "mfprobe" / "twice.py")
    assert module.twice(21) == 43  # what the file says now, not what was built
    assert finder.stale == [PROBE] and finder.loaded == []
    assert compiled.stale(root, root / "build", [PROBE]) == [PROBE]


def test_a_failed_build_leaves_nothing_to_import(probe_tree):
    root, finder = probe_tree
    (root / "mfprobe" / "twice.py").write_text("def twice(x):\n    return (\n")  # not Python
    with pytest.raises(subprocess.CalledProcessError):  # Cython refuses it
        compiled.build([PROBE], root=root, out=root / "build", jobs=1)
    assert not (root / "build" / "mfprobe" / "twice.sha256").exists()
    assert finder.find_spec(PROBE) is None


def test_a_stale_build_is_a_check_warning(probe_tree, monkeypatch):
    root, _finder = probe_tree
    monkeypatch.setattr(compiled, "ROOT", root)
    monkeypatch.setattr(compiled, "BUILD", root / "build")
    monkeypatch.setattr(compiled, "MODULES", (PROBE,))
    assert compiled_modules() == []
    (root / "mfprobe" / "twice.py").write_text("def twice(x):\n    return x * 2\n")
    [warning] = compiled_modules()
    assert warning.id == "gateway.W001" and warning.obj == PROBE
    monkeypatch.setenv("MODELFORGE_COMPILED", "0")
    assert compiled_modules() == []  # running as source was asked for


def test_the_request_path_runs_compiled_where_make_built_it():
    """``make test`` builds the modules first (``make COMPILE=0 test`` does not, and says so); this process
    imported them through the finder the package installs."""
    if os.environ.get("MODELFORGE_TEST_COMPILED", "1") == "0" or not compiled.enabled():
        pytest.skip("running as source was asked for (COMPILE=0 or MODELFORGE_COMPILED=0)")
    assert compiled.stale() == [], "a compiled module is stale: run `make install`"
    for name in compiled.MODULES:
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(compiled.SUFFIX), (
            f"{name} runs as source ({module.__file__}): run `make install`, which compiles it"
        )


def test_its_switch_is_a_known_name_and_a_misspelling_is_not():
    from modelforge.config import UNKNOWN_SETTING, SettingsReader

    misspelt = "MODELFORGE_" + "COMPILD"  # (spelt out, the repository's scan for names would count it)
    read = SettingsReader({"MODELFORGE_COMPILED": "0", misspelt: "0"})
    read.report_unknown()
    [unknown] = [problem.line() for problem in read.problems if problem.code == UNKNOWN_SETTING]
    assert misspelt in unknown and "did you mean MODELFORGE_COMPILED?" in unknown
