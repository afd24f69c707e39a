"""A batch written but never marked, in a Delta table whose older log files were cleaned up
(ARCHITECTURE §5, "A batch written but never marked").

``DeltaSink.holds_batch`` walks the table's log back to the batch's commit to follow the
RESTOREs after it. Once a checkpoint was written after the batch and the log files before it
expired (``delta.logRetentionDuration``; delta-rs cleans them up after a checkpoint), the
version before the batch's commit cannot be loaded. That walk raised, the start counted the
sink as "cannot tell", and the new epoch wrote the batch's rows (30-39) to ``bronze`` a second
time. A sink whose transaction says it holds the batch holds it unless a restore the history
shows took it out: the start is refused.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import UnmarkedBatchError
from tests.in_process_cli import Cli
from tests.integration import two_sink_resets as resets
from tests.integration.test_unmarked_batch import (
    _killed_after_bronze_wrote_batch_3 as killed_after_bronze_wrote_batch_3,
)
from tests.integration.two_sink_resets import NEW

_fan = partial(resets.fan, "unmarked")
_run, _ids = resets.run, resets.ids


def _expire_log_before_now(table: Path) -> None:
    """A checkpoint after the batch's commit, and the log files before it expired and
    cleaned up (a table kept for weeks does this by itself)."""
    from deltalake import DeltaTable

    delta = DeltaTable(str(table))
    delta.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    delta = DeltaTable(str(table))
    delta.create_checkpoint()
    delta.cleanup_metadata()
    with pytest.raises(Exception):  # noqa: B017 (delta-rs' error classes vary)
        DeltaTable(str(table), version=2)


def test_a_lost_mark_in_a_table_whose_old_log_was_cleaned_up_still_refuses(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    killed_after_bronze_wrote_batch_3(spark, tmp_path, fanout_cli)
    _expire_log_before_now(tmp_path / "bronze")
    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)  # recover's offsets
    assert str(refused.value).startswith(
        "pipeline 'unmarked': query query-new cannot start epoch 1: sink bronze holds batch 3 "
        "of epoch 0 by its own records, and the ledger had no mark of it"
    )
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _ids(tmp_path, "silver") == list(range(30))
