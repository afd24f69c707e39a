"""``fanout run PIPELINE.toml --accept-lost-target SINK`` end to end: a Delta table
deleted between runs refuses the next run, naming the flag; a flag naming no sink of the
file is a configuration error; the flag writes on into the table as it is; and kept on a
later command line (left in a script), the table holding its mark again, the run says to
drop it (before, an accepted sink was not asked at all). Every run is ``fanout run`` in
the test's process and session (the ``fanout_cli`` fixture: ``fanout.app.cli.main``, the
command line parsed as the console script parses it, its exit code and what it printed):
the flag, the refusal and the warning are the command's, not the process's; a Spark start
less for each of the four that were processes of their own."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration.streams import bronze_pipeline, delta_rows, id_counts, write_input

if TYPE_CHECKING:
    from tests.in_process_cli import Ran

pytestmark = pytest.mark.integration


def test_accept_lost_target_writes_on_once_and_says_so_when_nothing_is_lost(
    fanout_cli: Callable[..., Ran], tmp_path: Path
) -> None:
    def _run(config: Path, *args: str) -> tuple[int, str]:
        done = fanout_cli("run", config, *args)
        return done.returncode, done.stdout + done.stderr

    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)  # batch 0: orders 0-2
    code, out = _run(config)
    assert code == 0, out[-3000:]
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
        "0, which the ledger marks written there: there is no loss to accept at the start: "
        "drop the flag, unless the sink's refusal of a replayed batch named it (left on, it "
        "accepts this target's next loss unseen)"
    ) in out
    assert id_counts(delta_rows(tmp_path / "bronze")) == {3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1}
