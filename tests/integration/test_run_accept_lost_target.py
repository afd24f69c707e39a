"""``fanout run PIPELINE.toml --accept-lost-target SINK`` end to end, in real ``fanout run``
processes: a Delta table deleted between runs refuses the next run, naming the flag; a flag
naming no sink of the file is a configuration error; the flag writes on into the table as
it is; and kept on a later command line (left in a script), the table holding its mark
again, the run says to drop it (before, an accepted sink was not asked at all). The first
run, which only writes batch 0 for the others to find, is ``fanout run`` in the test's
process and session (``fanout.app.cli.main``, as tests/integration/test_run_new_epoch.py
runs it): one Spark start less; every run given the flag, or refused, is a process of its
own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout.app.cli import main
from tests.integration.streams import bronze_pipeline, delta_rows, id_counts, write_input

pytestmark = pytest.mark.integration


def _run(config: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "fanout.app.cli", "run", str(config), *args],
        capture_output=True, text=True, timeout=400, env=dict(os.environ),
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def test_accept_lost_target_writes_on_once_and_says_so_when_nothing_is_lost(
    spark: Any, tmp_path: Path
) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)  # batch 0: orders 0-2
    assert main(["run", str(config)]) == 0  # in this process: spark's session
    assert id_counts(delta_rows(tmp_path / "bronze")) == {0: 1, 1: 1, 2: 1}
    shutil.rmtree(tmp_path / "bronze")  # deleted behind fanout's back
    write_input(tmp_path / "input", 1, 3, start_file=1)  # batch 1: orders 3-5

    code, out = _run(config)
    assert code == 1, out[-3000:]
    assert (
        f"sink 'bronze', batch 0: pipeline 'clicks': path '{tmp_path / 'bronze'}' no longer "
        "holds batch 0 of epoch 0"
    ) in out
    assert f"`fanout run {config} --accept-lost-target bronze`" in out, out
    assert not (tmp_path / "bronze").exists()  # nothing written

    code, out = _run(config, "--accept-lost-target", "silver")
    assert code == 2, out[-3000:]
    assert (
        f"--accept-lost-target silver: pipeline 'clicks' ({config}) has no sink 'silver'\n"
        "Its sinks: bronze"
    ) in out
    assert not (tmp_path / "bronze").exists()

    code, out = _run(config, "--accept-lost-target", "bronze")
    assert code == 0, out[-3000:]
    assert id_counts(delta_rows(tmp_path / "bronze")) == {3: 1, 4: 1, 5: 1}

    write_input(tmp_path / "input", 1, 3, start_file=2)  # batch 2: orders 6-8
    code, out = _run(config, "--accept-lost-target", "bronze")  # the flag left in a script
    assert code == 0, out[-3000:]
    assert (
        "WARNING fanout: pipeline clicks, sink bronze: accept_lost_targets "
        f"(--accept-lost-target bronze): path '{tmp_path / 'bronze'}' holds batch 1 of epoch "
        "0, which the ledger marks written there: there is no loss to accept; drop the flag "
        "(left on, it accepts this target's next loss unseen)"
    ) in out
    assert id_counts(delta_rows(tmp_path / "bronze")) == {3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
