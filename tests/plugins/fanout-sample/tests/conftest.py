"""The sample plugin's tests: its distribution, installed when missing (CI installs only
the built-in plugins) into a directory of this test process's own, never into the shared
environment: the suite's other worker process would see its entry point there without
being able to import it (an install's import path is read at start-up)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1]


def _activate_pth_files(dist: importlib.metadata.Distribution) -> None:
    """Process the distribution's ``.pth`` files (an editable install's import hook),
    which the running interpreter only reads at start-up."""
    site_dir = str(dist.locate_file(""))
    for file in dist.files or []:
        if file.suffix == ".pth":
            site.addpackage(site_dir, file.name, None)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def sample_distribution(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[importlib.metadata.Distribution]:
    """The ``fanout-sample`` distribution: the environment's when installed there (a
    developer's editable install), else installed for this module into a private
    directory put first on ``sys.path`` (where ``importlib.metadata`` finds its entry
    points) and on ``PYTHONPATH`` (for the drivers the tests start), and taken off both
    afterwards."""
    try:
        dist = importlib.metadata.distribution("fanout-sample")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        try:
            importlib.import_module("fanout_sample.plugin")
        except ModuleNotFoundError:
            _activate_pth_files(dist)
            importlib.invalidate_caches()
            importlib.import_module("fanout_sample.plugin")
        yield dist
        return
    work = tmp_path_factory.mktemp("fanout-sample")
    source, target = work / "source", work / "site"
    # built from a copy: a build writes build/ and *.egg-info beside its sources
    shutil.copytree(SAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "tests"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
         str(target), str(source)],
        check=True,
    )  # fmt: skip
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    path_before = os.environ.get("PYTHONPATH")  # the drivers these tests start find it too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), path_before]))
    try:
        yield importlib.metadata.distribution("fanout-sample")
    finally:
        if path_before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path_before
        sys.path.remove(str(target))
        for name in [
            m for m in sys.modules if m == "fanout_sample" or m.startswith("fanout_sample.")
        ]:
            del sys.modules[name]
        importlib.invalidate_caches()
