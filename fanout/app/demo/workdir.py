"""The demo's working directory: created and marked by the demo, and the only thing it
ever clears.

``fanout demo --workdir DIR`` reuses DIR only when an earlier demo made it (a marker file
names it as the demo's), and then removes only the entries the demo creates. A directory
with anything else in it is refused: fanout never deletes what it did not create.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fanout.errors import ConfigurationError

MARKER = ".fanout-demo"
"""The file that marks a directory as the demo's own."""

DEMO_ENTRIES = frozenset(
    {MARKER, "input", "bronze", "latest", "_fanout_ledger", "checkpoint", "outage.json", "postgres"}
)
"""Everything the demo creates in its directory."""


def prepare_workdir(root: Path) -> None:
    """Make ``root`` an empty demo directory: create and mark it when new or empty; clear
    an earlier demo's entries; refuse anything else with a message saying why."""
    if root.exists() and not root.is_dir():
        raise ConfigurationError(f"--workdir {root}: exists and is not a directory")
    entries = sorted(p.name for p in root.iterdir()) if root.exists() else []
    if entries:
        if MARKER not in entries:
            raise ConfigurationError(
                f"--workdir {root}: the directory is not empty and was not made by "
                f"`fanout demo` (it has no {MARKER} file), and fanout never deletes what it "
                "did not create. Name a new or empty directory, or leave out --workdir."
            )
        foreign = [name for name in entries if name not in DEMO_ENTRIES]
        if foreign:
            raise ConfigurationError(
                f"--workdir {root}: an earlier demo's directory, but it also holds "
                f"{', '.join(foreign)}, which the demo did not create; move them away or "
                "name another directory (fanout never deletes what it did not create)."
            )
        for name in entries:
            path = root / name
            if name == MARKER:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by `fanout demo`; `fanout demo --workdir` may clear it\n")
