"""The documentation keeps up with the code: every hook and public name is documented."""

from __future__ import annotations

import inspect
from pathlib import Path

import fanout
from fanout.hooks import specs as hookspecs

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
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


def test_every_hook_is_named_in_the_readme() -> None:
    for name in HOOKS:
        assert f"`{name}`" in README, name


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
