"""``fanout validate`` on a pipeline file whose source declares its schema, as the tests of
its checklist run it (the core's and the plugins')."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.streams import pipeline_file


@dataclass(frozen=True)
class Validated:
    """What ``fanout validate`` said: its exit ``code``, its standard output and error."""

    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        """The checklist: the lines of the output indented by two spaces."""
        return [line for line in self.out.splitlines() if line.startswith("  ")]


def validate(data: Path, schema: str, sinks: str, capsys: Any, name: str = "checks") -> Validated:
    """Run ``fanout validate`` on ``data/pipeline.toml``, written here: pipeline ``name`` on
    Spark ``local[2]``, ledger and checkpoint under ``data``, reading JSON files of
    ``schema`` from ``data/input`` (made here, empty), writing ``sinks`` (their
    ``[[sinks]]`` TOML)."""
    from fanout.app.cli import main

    (data / "input").mkdir()
    config = data / "pipeline.toml"
    config.write_text(pipeline_file(data, name, schema, sinks, master="local[2]"))
    code = main(["validate", str(config)])
    captured = capsys.readouterr()
    return Validated(code, captured.out, captured.err)
