"""The design and the READMEs name the code where it lives: every dotted Python name they
quote (`` `fanout_kafka.renewal.UNREPORTED_RENEWAL_S` ``) resolves, so a function moved or
renamed (a restructuring) cannot leave the contract pointing at nothing; and every part of
the design the code cites (``docs/architecture.md §8.2``) is a part its contents table
lists, on a page that holds that part."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS = (
    "docs/architecture.md",
    *sorted(f"docs/architecture/{page.name}" for page in (ROOT / "docs/architecture").glob("*.md")),
    "README.md",
    "plugins/fanout-kafka/README.md",
    "plugins/fanout-postgres/README.md",
)
CITED_PART = re.compile(r"architecture\.md,?\s+§(\d+(?:\.\d+)?)")
LISTED_PART = re.compile(
    r"^\| (\d+(?:\.\d+)?) \| (?:\[[^]]+\]\((architecture/[^)]+)\)|[^|]+\(below\)) \|", re.M
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


def parts() -> dict[str, str]:
    """The parts the contents table of docs/architecture.md lists: number -> the page
    holding it (``docs/architecture.md`` itself for the parts written there)."""
    return {
        number: f"docs/{page}" if page else "docs/architecture.md"
        for number, page in LISTED_PART.findall(ARCHITECTURE.read_text())
    }


def test_the_contents_table_lists_every_part_on_a_page_that_opens_with_it() -> None:
    listed = parts()
    assert list(listed) == [
        *("1", "2", "3", "4", "5", "6", "7", "8", "8.1", "8.2", "8.3"),
        *("9", "10", "11", "12", "13", "14", "15"),
    ]
    for number, page in listed.items():
        lines = (ROOT / page).read_text().splitlines()
        heading = re.compile(rf"#+ {re.escape(number)}\.? ")
        if page == "docs/architecture.md":
            assert any(heading.match(line) for line in lines), number
        else:
            assert heading.match(lines[0]), (number, page)
    pages = {page.name for page in (ROOT / "docs/architecture").glob("*.md")}
    assert pages == {Path(page).name for page in listed.values()} - {"architecture.md"}


def _cited_parts() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for folder in ("fanout", "plugins", "tests", "bench", "examples", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".md") and ".venv" not in path.parts:
                for number in CITED_PART.findall(path.read_text(errors="replace")):
                    cited.setdefault(number, set()).add(str(path.relative_to(ROOT)))
    for number in CITED_PART.findall((ROOT / "README.md").read_text()):
        cited.setdefault(number, set()).add("README.md")
    return cited


def test_every_part_the_code_cites_is_listed() -> None:
    cited = _cited_parts()
    assert {"3.4", "5", "8.2", "14.4"} <= set(cited)
    listed = set(parts())
    for number, where in cited.items():
        major = number.split(".")[0]
        # 14.4 lives on the page of 14; 8.1 has a page of its own
        assert number in listed or major in listed, (number, sorted(where))
        if number not in listed:
            page = parts()[major]
            assert re.search(rf"^#+ {re.escape(number)} ", (ROOT / page).read_text(), re.M), (
                number,
                page,
                sorted(where),
            )
