"""A PostgreSQL append sink renamed between a crash and its replay (docs/architecture.md
§8.2, "A sink renamed mid-batch").

Its progress marks are keyed by its name: killed after its partitions committed batch N and
before its ledger mark, then restarted with the sink renamed (same table), the replay found
no marks under the new name and wrote every partition of N again, silently. The sink now
refuses that write, naming the old sink, the batch and what to do, and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchFailedError, BatchInfo, FanOut, RenamedSinkError
from fanout.testing.faults import MarkLost


def _fan(url: str, ledger: Any, name: str, **options: Any) -> FanOut:
    sink = {"type": "postgres", "name": name, "url": url, "table": "orders",
            "mode": "append", "partitions": 2, **options}  # fmt: skip
    return FanOut("pgren", ledger, [sink], retries=0)


def test_an_append_sink_renamed_between_a_crash_and_its_replay_is_refused(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, "CREATE TABLE orders (id bigint)")
    ledger = str(tmp_path / "ledger")
    with pytest.raises(BatchFailedError):  # the driver "dies" before the mark
        _fan(pg_url, MarkLost(ledger, "old"), "old").process(
            spark.range(4, 8), BatchInfo("pgren", 1, "q")
        )
    ids = [(i,) for i in range(4, 8)]
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == ids

    renamed = _fan(pg_url, ledger, "new")
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))
    assert isinstance(refused.value.failures["new"], RenamedSinkError)
    text = str(refused.value.failures["new"])
    assert "partition(s) [0, 1] of batch 1" in text and "sink 'old'" in text
    assert "rename the sink back to 'old'" in text and "or remove" not in text
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == ids  # before: 4-7 twice
    # the same FanOut given the batch again (a library caller's retry, a lagging sink's
    # catch-up): refused again (before: the check was spent by the refusal, 4-7 twice)
    with pytest.raises(BatchFailedError) as again:
        renamed.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))
    assert isinstance(again.value.failures["new"], RenamedSinkError)
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == ids
    renamed.close()

    # the way out it names: the old name completes the batch, then the new one goes on
    back = _fan(pg_url, ledger, "old")
    assert back.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))["old"].already_written
    back.close()
    after = _fan(pg_url, ledger, "new")
    after.process(spark.range(8, 10), BatchInfo("pgren", 2, "q"))
    after.close()
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == [(i,) for i in range(4, 10)]


def test_a_renamed_sink_with_earlier_marks_is_refused_by_the_start_check_not_another_table(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The usual rename: the old name marked earlier batches, so the ledger names it and the
    run's first batch asks the new sink's table for its next batch
    (:mod:`fanout.steps.renamed`, ``holds_batch_of``): refused before any partition writes.
    A new sink on another table is not refused for it (the old name's marks recorded
    another table's OID)."""
    execute(pg_url, "CREATE TABLE orders (id bigint)")
    execute(pg_url, "CREATE TABLE audit (id bigint)")
    ledger = str(tmp_path / "ledger")
    _fan(pg_url, ledger, "old").process(spark.range(0, 4), BatchInfo("pgren", 0, "q"))
    with pytest.raises(BatchFailedError):  # the driver "dies" before the mark of batch 1
        _fan(pg_url, MarkLost(ledger, "old"), "old").process(
            spark.range(4, 8), BatchInfo("pgren", 1, "q")
        )
    ids = [(i,) for i in range(8)]

    renamed = _fan(pg_url, ledger, "new")
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))
    renamed.close()
    assert isinstance(refused.value.failures["new"], RenamedSinkError)
    text = str(refused.value.failures["new"])
    assert "table 'orders' holds batch 1 of sink 'old' (epoch 0, its records keyed " in text
    assert "rename the sink back to 'old'" in text
    # no removal offered: taking batch 1's rows out of the table leaves old's marks of it,
    # so the check would refuse again (PostgresSink.batch_removable is False)
    assert "remove batch" not in text and "RESTORE" not in text
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == ids  # before: 4-7 twice

    other = _fan(pg_url, ledger, "audit", table="audit")
    assert other.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))["audit"].rows == 4
    other.close()
    assert query(pg_url, "SELECT id FROM audit ORDER BY id") == ids[4:]
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == ids


def test_an_upsert_sink_with_dead_letters_renamed_between_a_crash_and_its_replay_is_refused(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Upsert rewrites converge, but the rows a batch refused go to the dead-letter target
    under the sink's name: killed in its first batch (the ledger never named ``old``) and
    renamed, the replay wrote the refused rows 6 and 7 a second time, under ``new``. The
    sink now refuses it as append does; without a dead-letter target it writes on."""
    execute(pg_url, "CREATE TABLE orders (id bigint PRIMARY KEY CHECK (id < 6))")
    ledger = str(tmp_path / "ledger")
    upsert = {"mode": "upsert", "keys": ["id"], "dead_letter": "postgres:dead"}
    with pytest.raises(BatchFailedError):
        _fan(pg_url, MarkLost(ledger, "old"), "old", **upsert).process(
            spark.range(4, 8), BatchInfo("pgren", 1, "q")
        )
    letters = "SELECT sink, (row->>'id')::int FROM dead ORDER BY 2, 1"
    assert query(pg_url, letters) == [("old", 6), ("old", 7)]

    renamed = _fan(pg_url, ledger, "new", **upsert)
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))
    with pytest.raises(BatchFailedError) as again:  # the same FanOut again: refused again
        renamed.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))
    assert isinstance(again.value.failures["new"], RenamedSinkError)
    renamed.close()
    assert isinstance(refused.value.failures["new"], RenamedSinkError)
    text = str(refused.value.failures["new"])
    assert "upsert_routes records partition(s) [0, 1] of batch 1 as committed to table " \
           "orders by sink 'old'" in text  # fmt: skip
    assert "put the rows they refused in PostgreSQL table dead a second time" in text
    assert "rename the sink back to 'old'" in text
    # before: ("new", 6), ("new", 7) beside them
    assert query(pg_url, letters) == [("old", 6), ("old", 7)]
    assert query(pg_url, "SELECT id FROM orders ORDER BY id") == [(4,), (5,)]

    back = _fan(pg_url, ledger, "old", **upsert)  # the way out it names
    back.process(spark.range(4, 8), BatchInfo("pgren", 1, "q"))
    back.close()
    assert query(pg_url, letters) == [("old", 6), ("old", 7)]
    plain = _fan(pg_url, ledger, "plain", mode="upsert", keys=["id"])  # no letters: writes
    assert plain.process(spark.range(4, 6), BatchInfo("pgren", 2, "q"))["plain"].rows == 2
    plain.close()
