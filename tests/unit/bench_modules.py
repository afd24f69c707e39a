"""The benchmark scripts' modules, for their unit tests (no Spark).

They are loaded by path and leave nothing behind: ``bench/`` off ``sys.path`` again and
every module read from it off ``sys.modules``, else a later ``import common`` (or any other
name bench/ shares with a test's own modules) would find the benchmark's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(*names: str) -> tuple[ModuleType, ...]:
    """``bench/<name>.py`` of each name, loaded in order (a later one may import an
    earlier one by name)."""
    path, before = list(sys.path), set(sys.modules)
    loaded = []
    try:
        for name in names:
            spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
            assert spec is not None and spec.loader is not None
            # in sys.modules while it runs: its dataclasses look their module up there
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded.append(module)
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - before:
            if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == BENCH:
                del sys.modules[name]
    return tuple(loaded)
