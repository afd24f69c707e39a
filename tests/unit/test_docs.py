"""The documentation keeps up with the code: every hook and public name is documented."""

from __future__ import annotations

import inspect
from pathlib import Path

import fanout
from fanout.hooks import specs as hookspecs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SINK_GUIDE = (ROOT / "docs" / "writing-sinks.md").read_text()
"""The plugin author's reference, moved out of the README's "Writing a sink plugin"."""
HOOKS = [
    name
    for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("fanout_")
]


def test_every_hook_has_a_docstring_with_its_parameters() -> None:
    assert len(HOOKS) == 13
    for name in HOOKS:
        function = getattr(hookspecs, name)
        doc = inspect.getdoc(function) or ""
        assert doc, name
        for parameter in inspect.signature(function).parameters:
            assert f":param {parameter}:" in doc, f"{name} does not document {parameter}"


def test_every_hook_is_named_in_the_plugin_authors_docs() -> None:
    for name in HOOKS:
        assert f"`{name}`" in README + SINK_GUIDE, name


def test_the_sink_guide_shows_the_partitioned_example_verbatim() -> None:
    example = (ROOT / "examples" / "partitioned_sink.py").read_text()
    assert "```python\n" + example + "```" in SINK_GUIDE


def test_the_readme_links_each_section_of_the_sink_guide() -> None:
    anchors = [
        "#" + "".join(c for c in line[3:].lower().replace(" ", "-") if c.isalnum() or c in "-_")
        for line in SINK_GUIDE.splitlines()
        if line.startswith("## ")
    ]
    assert len(anchors) == 5
    for anchor in anchors:
        assert f"(docs/writing-sinks.md{anchor})" in README, anchor


def test_every_public_name_has_a_docstring() -> None:
    for name in fanout.__all__:
        if name.startswith("__") or name in ("Guarantee", "Reads"):  # Literal aliases
            continue
        assert inspect.getdoc(getattr(fanout, name)), name


def test_readme_quick_start_has_exactly_two_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [b.strip() for b in quick.split("```bash")[1:]]
    assert len(commands) == 2
    assert commands[0].split("```")[0].strip().endswith("fanout demo")
    assert "pytest" in commands[1].split("```")[0]


def test_what_a_sink_plugin_declares_is_in_the_facade() -> None:
    """A plugin declares its options (SinkOption) and an upsert's stable keys
    (StableColumns) from ``fanout`` itself, as the README's contract says."""
    needed = {"Sink", "SinkContext", "SinkResult", "SinkOption", "StableColumns", "PartlyHeld",
              "IdempotencyKey", "txn_app_id", "Reads"}  # fmt: skip
    assert needed - set(fanout.__all__) == set()
    # holds_batch rebuilds a batch's key: IdempotencyKey(txn_app_id(...), batch_id)
    from fanout.contract import batch, sink

    assert (fanout.txn_app_id, fanout.Reads) == (batch.txn_app_id, sink.Reads)
    assert fanout.SinkOption.__module__ == "fanout.contract.options"
    assert fanout.StableColumns.__module__ == "fanout.contract.partitions"


def test_the_readme_pyproject_of_a_plugin_builds_and_registers_it() -> None:
    """The snippet a plugin author copies had no ``[build-system]`` nor package list: a
    newcomer could not tell whether ``pip install -e .`` would find the package."""
    import tomllib

    snippet = README.split("# pyproject.toml of your distribution", 1)[1].split("```", 1)[0]
    toml = tomllib.loads(snippet.split("\n", 1)[1])
    assert toml["build-system"]["build-backend"] == "setuptools.build_meta"
    assert toml["project"]["entry-points"]["fanout"] == {"jsonl": "fanout_jsonl.plugin"}
    assert toml["tool"]["setuptools"]["packages"]["find"]["include"] == ["fanout_jsonl*"]
