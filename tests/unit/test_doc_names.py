"""The design and the READMEs name the code where it lives: every dotted Python name they
quote (`` `fanout_kafka.renewal.UNREPORTED_RENEWAL_S` ``) resolves, so a function moved or
renamed (a restructuring) cannot leave the contract pointing at nothing."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "docs/architecture.md",
    "README.md",
    "plugins/fanout-kafka/README.md",
    "plugins/fanout-postgres/README.md",
)
QUOTED = re.compile(
    r"`((?:fanout|fanout_delta|fanout_postgres|fanout_kafka)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`"
)


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def unresolved(text: str) -> list[str]:
    """The names quoted in ``text`` under a package's module (``fanout.steps.x``,
    ``fanout_kafka.renewal.y``) that do not resolve. A name whose second part is no module
    is not code (a Delta commit property such as ``fanout.progress``, a Kafka header such
    as ``fanout.batch_id``, a Java class) and is passed over."""
    missing = []
    for name in sorted(set(QUOTED.findall(text))):
        parts = name.split(".")
        found, depth = None, 0
        for i in range(len(parts), 1, -1):
            found = _module(".".join(parts[:i]))
            if found is not None:
                depth = i
                break
        if found is None:
            continue
        target: object = found
        for part in parts[depth:]:
            if not hasattr(target, part):
                missing.append(name)
                break
            target = getattr(target, part)
    return missing


def test_every_quoted_module_name_in_the_docs_resolves() -> None:
    for doc in DOCS:
        assert unresolved((ROOT / doc).read_text()) == [], doc


def test_a_name_moved_away_is_found() -> None:
    text = "see `fanout.fan_out.FanOut._refused_before_writing` and `fanout.progress`"
    assert unresolved(text) == ["fanout.fan_out.FanOut._refused_before_writing"]
