"""``fanout validate`` on a pipeline file whose source declares its schema, as the tests of
its checklist run it (the core's and the plugins')."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.in_process_cli import Cli
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


def validate(
    data: Path, schema: str, sinks: str, fanout_cli: Cli, name: str = "checks"
) -> Validated:
    """Run ``fanout validate`` on ``data/pipeline.toml``, written here: pipeline ``name`` on
    Spark ``local[2]``, ledger and checkpoint under ``data``, reading JSON files of
    ``schema`` from ``data/input`` (made here, empty), writing ``sinks`` (their
    ``[[sinks]]`` TOML), in the test's process (``fanout_cli``)."""
    (data / "input").mkdir()
    config = data / "pipeline.toml"
    config.write_text(pipeline_file(data, name, schema, sinks, master="local[2]"))
    ran = fanout_cli("validate", config)
    return Validated(ran.returncode, ran.stdout, ran.stderr)
