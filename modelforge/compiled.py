"""The request path's modules compiled by Cython, where ``make`` built them, else run as source.

The gateway's own CPU per request is what its latency target is made of (bench/gateway), and about two
thirds of it is the interpreter running these modules. Compiled by Cython from the same files, unchanged
(no type declarations: ``annotation_typing`` off, so every annotation means what it means to Python),
they take about 15 % fewer instructions per request (``bench/gateway/instructions.py``: embeddings 326k
→ 280k, a stream 456k → 387k; docs/DECISIONS.md 2026-12-07).

``make install`` builds them into ``build/compiled/`` (``compiled.build()``): a copy of
each source, its SHA-256 beside it, and the extension module. A process imports the extension module only
while its recorded SHA-256 is the source's own, so a source edited after the build runs as source (never
a stale binary in place of what the file says) until the next ``make`` rebuilds it; ``manage.py check``
warns about it (``modelforge.W030``). ``MODELFORGE_COMPILED=0`` runs every module as source (a profiler
such as py-spy sees into source modules only).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

# The modules a proxied request runs through (apps/gateway, the lean HTTP path): nothing else is compiled.
MODULES = (
    "modelforge.http_protocol",
    "modelforge.lean",
    "apps.gateway.gateway",
    "apps.gateway.upstream",
    "apps.gateway.limits",
    "apps.gateway.usage",
    "apps.gateway.routing",
    "apps.gateway.resp",
)
ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "compiled"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
# Cython's options: Python 3 semantics; annotations are not C types (the sources are plain Python).
DIRECTIVES = ("language_level=3", "annotation_typing=False")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CompiledFinder:
    """A meta path finder for ``MODULES``: the built extension module when it was built from the source as
    it is now, else nothing (the usual finders then import the source)."""

    def __init__(self, root: Path = ROOT, build: Path = BUILD, modules: Sequence[str] = MODULES) -> None:
        self.root, self.build, self.modules = root, build, frozenset(modules)
        self.loaded: list[str] = []  # imported compiled
        self.stale: list[str] = []  # built from another version of the source: imported as source

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.modules:
            return None
        relative = fullname.replace(".", "/")
        binary = self.build / (relative + SUFFIX)
        try:
            built_from = (self.build / (relative + ".sha256")).read_text().strip()
            current = digest(self.root / (relative + ".py"))
        except OSError:
            return None  # not built (or no source: the usual finders say so)
        if not binary.is_file():
            return None
        if built_from != current:
            self.stale.append(fullname)
            return None
        self.loaded.append(fullname)
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(binary))
        return importlib.util.spec_from_file_location(fullname, binary, loader=loader)


FINDER = CompiledFinder()


def built(name: str, build: Path | None = None) -> bool:
    """Whether ``name`` has a finished build (its extension module and the SHA-256 of its source)."""
    relative = (build or BUILD) / name.replace(".", "/")
    return Path(str(relative) + SUFFIX).is_file() and Path(str(relative) + ".sha256").is_file()


def stale(
    root: Path | None = None, build: Path | None = None, modules: Sequence[str] | None = None
) -> list[str]:
    """The modules built from another version of their source (run as source until the next ``make``)."""
    root, build = root or ROOT, build or BUILD
    found = []
    for name in MODULES if modules is None else modules:
        relative = name.replace(".", "/")
        try:
            built_from = (build / (relative + ".sha256")).read_text().strip()
        except OSError:
            continue  # not built
        try:
            if built_from != digest(root / (relative + ".py")):
                found.append(name)
        except OSError:
            found.append(name)
    return found


def enabled() -> bool:
    return os.environ.get("MODELFORGE_COMPILED", "1") != "0"


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once), unless ``MODELFORGE_COMPILED=0``."""
    if enabled() and FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def build(modules: Sequence[str] = MODULES, root: Path = ROOT, out: Path = BUILD, jobs: int = 2) -> None:
    """Compile ``modules`` into ``out``: each source copied (with its packages' ``__init__.py``, so that
    Cython names the module as the source tree does), its SHA-256 recorded, then ``cythonize`` in place."""
    import shutil
    import subprocess

    for stale in out.rglob("*.sha256") if out.exists() else ():
        stale.unlink()  # until this build has finished, nothing built is used
    copies = []
    for name in modules:
        relative = name.replace(".", "/")
        source, copy = root / (relative + ".py"), out / (relative + ".py")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
        package = copy.parent
        while package != out:
            (package / "__init__.py").touch()
            package = package.parent
        copies.append((copy, out / (relative + ".sha256"), digest(copy)))
    command = [sys.executable, "-m", "Cython.Build.Cythonize", "-i", "-q", "-j", str(jobs)]
    for directive in DIRECTIVES:
        command += ["-X", directive]
    subprocess.run([*command, *(str(copy) for copy, _, _ in copies)], cwd=out, check=True)
    for _copy, stamp, source_digest in copies:
        stamp.write_text(source_digest + "\n")  # last: a failed build leaves no stamp, so nothing is used
