"""``fanout recover --spool`` after a spooling cut short: the driver (a subprocess) is
killed while it spools batch 2 for the lagging sink ``lag``, after the batch's index row
and before its rows, once sink ``lake`` marked the batch. A restart of the same checkpoint
would spool the batch again and append its rows; a checkpoint reset never does.

The report counted ``lag`` at batch 2 "from the spool" and said to resume after batch 2,
"nothing written twice": the new checkpoint would never read batch 2 again, and the
catch-up could not give it to ``lag`` either (its rows are not in the spool). A batch
whose rows the spool lacks holds nothing for its sinks: ``lag`` counts at batch 1, batch 2
is given up at the reset, and the resume point is before it (``lake`` then gets it twice,
which the report says)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from fanout.spool.table import read_spooled
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.driver import PIPELINE
from tests.integration.streams import committed_marks, write_input
from tests.newest_lines import without_newest

DRIVER = Path(__file__).with_name("driver.py")


def test_recover_does_not_count_a_spooled_batch_whose_rows_were_never_written(
    tmp_path: Path,
) -> None:
    write_input(tmp_path / "input", 4, 5)
    # lag's table takes no batch (a column of another type): it lags from batch 0 on
    write_deltalake(str(tmp_path / "lag"), pa.table({"order_id": pa.array([], pa.string())}))
    config = tmp_path / "sinks.json"
    config.write_text(
        json.dumps(
            [
                {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
                {"type": "delta", "name": "lag", "path": str(tmp_path / "lag"),
                 "on_failure": "lag"},
            ]
        )
    )  # fmt: skip
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--sinks", str(config),
           "--kill-spooling", "2:lake"]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL while spooling batch 2" in killed.stderr
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("lake", b): 1 for b in range(3)}
    spooled = read_spooled(str(tmp_path / "spool"), PIPELINE)
    assert [(b.batch_id, sorted(b.needed_by), b.rows_missing) for b in spooled] == [
        (0, ["lag"], False), (1, ["lag"], False), (2, ["lag"], True),
    ]  # fmt: skip

    recover = [sys.executable, "-m", "fanout", "recover", "--ledger", str(tmp_path / "ledger"),
               "--pipeline", PIPELINE, "--spool", str(tmp_path / "spool"),
               "--no-record"]  # fmt: skip
    report = subprocess.run(recover, capture_output=True, text=True, timeout=300)

    assert report.returncode == 0, report.stderr[-3000:]
    lines = without_newest(report.stdout)[0].splitlines()  # the newest-mark line apart
    assert [line.split(",")[0] for line in lines[1:4]] == [
        "  lag: batch 1",
        "  lake: batch 2",
        "  lag: batch(es) 2 in the spool",
    ]
    assert lines[4].startswith(
        "Resume after batch 1 (sink 'lag' is furthest behind); sink lake already holds "
        "batch 2 and will write its rows again"
    ), report.stdout
