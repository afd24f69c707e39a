"""The sample plugin's tests: its distribution, installed editable into the running
interpreter when missing (CI installs only the built-in plugins)."""

from __future__ import annotations

import importlib
import importlib.metadata
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


@pytest.fixture(scope="session")
def sample_distribution() -> Iterator[importlib.metadata.Distribution]:
    """The installed ``fanout-sample`` distribution (installed editable when missing)."""
    try:
        dist = importlib.metadata.distribution("fanout-sample")
    except importlib.metadata.PackageNotFoundError:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(SAMPLE)],
            check=True,
        )
        importlib.invalidate_caches()
        dist = importlib.metadata.distribution("fanout-sample")
    try:
        importlib.import_module("fanout_sample.plugin")
    except ModuleNotFoundError:
        _activate_pth_files(dist)
        importlib.invalidate_caches()
        importlib.import_module("fanout_sample.plugin")
    yield dist
