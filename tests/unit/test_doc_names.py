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


def _citing_files() -> list[tuple[str, str]]:
    """Each file that may cite the design (path from the repository's root, text): the
    code's folders, the docs and the README."""
    paths = [ROOT / "README.md"] + [
        path
        for folder in ("fanout", "plugins", "tests", "bench", "examples", "docs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".md") and ".venv" not in path.parts
    ]
    return [(str(path.relative_to(ROOT)), path.read_text(errors="replace")) for path in paths]


def _cited_parts() -> dict[str, set[str]]:
    cited: dict[str, set[str]] = {}
    for where, text in _citing_files():
        for number in CITED_PART.findall(text):
            cited.setdefault(number, set()).add(where)
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


TITLED = re.compile(r'§(\d+(?:\.\d+)?),?\s+"([^"]{3,120})"')
"""A part cited with the title of one of its paragraphs: ``§5, "A batch written but never
marked"`` (a bold or italic lead, or a heading, on that part's page)."""


def _plain(text: str) -> str:
    """``text`` with code marks dropped and its lines joined, as a title is compared."""
    return " ".join(text.replace("`", "").split())


def _titles_cited(text: str) -> list[tuple[str, str]]:
    """Each (part, title) ``text`` cites; a title wrapped over comment or docstring lines
    reads as one line."""
    return TITLED.findall(re.sub(r"\n\s*(?:#\s*)?", " ", text))


def _titled_citations() -> list[tuple[str, str, str]]:
    """Each (file, part, title) cited under the code's folders, in docs and the README."""
    return [(where, *cited) for where, text in _citing_files() for cited in _titles_cited(text)]


def test_every_paragraph_title_a_citation_quotes_is_on_its_parts_page() -> None:
    """A title quoted after a part (``§5, "A target lost behind fanout's back"``) is found
    on that part's page, or for a part with parts of its own (8: 8.1-8.3) on theirs: a
    paragraph renamed or moved leaves no citation pointing at nothing."""
    listed = parts()
    texts = {number: _plain((ROOT / page).read_text()) for number, page in listed.items()}
    citations = _titled_citations()
    assert len(citations) > 100
    missing = []
    for where, number, title in citations:
        major = number.split(".")[0]
        pages = [t for n, t in texts.items() if n in (number, major) or n.startswith(f"{number}.")]
        if not any(_plain(title) in text for text in pages):
            missing.append((where, number, title))
    assert missing == []


def test_a_paragraph_title_no_page_holds_is_found() -> None:
    text = "(docs/architecture.md §" + '5, "A checkpoint\n    # lost on a Tuesday")'
    ((number, title),) = _titles_cited(text)
    assert (number, title) == ("5", "A checkpoint lost on a Tuesday")
    assert title not in _plain((ROOT / parts()["5"]).read_text())
