"""An append sink's batch whose progress marks another query committed: the pipeline's
checkpoint (and ledger) were replaced and it starts again under the same name. The driver
refuses it before any partition writes (the query that reads the batch's marks reads
their query ids too), and the refusal prints the ``DELETE`` of the earlier run's marks
with its values, leading with the ways that write nothing twice; a partition that meets
such a mark anyway (it committed after the driver's read) is refused with the same
statement. Followed, the ``DELETE`` appends the re-read rows a second time, as both
messages say. Real Spark, real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.errors import SinkWriteError
from fanout.testing import open_sink

DDL = "CREATE TABLE t (id bigint NOT NULL, name text NOT NULL)"
SCHEMA = "id LONG, name STRING"
ROWS = [(1, "a"), (2, "b")]
DELETE = "DELETE FROM fanout.progress WHERE pipeline = 'o''brien' AND sink = 'pg'"

pytestmark = pytest.mark.usefixtures("no_kept_connections")


def _table(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, name FROM t ORDER BY id, name")


def _batch(spark: Any, query_id: str) -> Batch:
    df = spark.createDataFrame(ROWS, SCHEMA)
    return Batch(df, BatchInfo("o'brien", 0, query_id), "pg", "fanout/o'brien/pg")


def _marks(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT batch_id, partition, query_id FROM fanout.progress ORDER BY 2")


def test_a_new_query_meeting_an_earlier_run_s_marks_is_refused_before_writing(
    spark: Any, pg_url: str
) -> None:
    """Batch 0 of query ``q-old`` committed partition 1 (both rows hash there; an empty
    partition keeps no mark); the same batch of query ``q-new`` (a new checkpoint
    re-reading the same input) is refused on the driver: the message names the partition,
    both queries and the exact ``DELETE`` (the pipeline's quote doubled), and says what it
    does to the table. The table keeps the earlier run's two rows. Running the printed
    ``DELETE`` lets the batch write, and the table then holds each row twice. Before, the
    driver let the batch through and each partition failed with ``DELETE FROM
    <schema>.progress WHERE pipeline = ... AND sink = ...``."""
    execute(pg_url, DDL)
    sink = open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode="append", partitions=2), "o'brien"
    )
    assert sink.write(_batch(spark, "q-old")).rows == 2
    again = _batch(spark, "q-new")

    expected = (
        "fanout.progress marks partition(s) [1] of batch 0 of this sink as committed to "
        't in pipeline "o\'brien" by query q-old; this is query q-new. A query '
        "keeps its id with its checkpoint, so the pipeline's checkpoint (and ledger) were "
        "replaced and it starts again under the same name, or another pipeline of that name "
        "writes this sink. Nothing was written. Restore the pipeline's ledger and "
        "checkpoint; or, to write the table again from this batch on, give the pipeline a "
        "new name. Deleting the earlier run's marks lets this run write under the same "
        f"name: {DELETE}; but the rows the earlier run appended to t stay "
        "there, and a batch reading the same input again appends them a second time"
    )
    with pytest.raises(SinkWriteError) as refused:
        sink.check_replay(again)  # on the driver, before the route letters and partitions
    assert str(refused.value) == f"sink 'pg', batch 0: {expected}"
    with pytest.raises(SinkWriteError) as written:
        sink.write(again)
    assert str(written.value) == f"sink 'pg', batch 0: {expected}"  # no partition task ran
    assert _table(pg_url) == [(1, "a"), (2, "b")]

    execute(pg_url, DELETE)  # what the message prints, as printed
    assert _marks(pg_url) == []
    assert sink.write(again).rows == 2
    assert _table(pg_url) == [(1, "a"), (1, "a"), (2, "b"), (2, "b")]  # as it warned
    assert _marks(pg_url) == [(0, 1, "q-new")]  # both rows hash to partition 1


def test_a_partition_meeting_a_mark_committed_after_the_driver_s_read_prints_the_delete(
    spark: Any, pg_url: str
) -> None:
    """The driver read no mark (query ``q-new`` prepared its write first); query ``q-old``
    then committed the batch; ``q-new``'s partitions meet its marks and fail, each
    printing the exact ``DELETE`` and what it does to the table, and write nothing."""
    execute(pg_url, DDL)
    sink = open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode="append", partitions=1), "o'brien"
    )
    late = sink.prepare_partitions(_batch(spark, "q-new"))
    other = open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode="append", partitions=1), "o'brien"
    )
    assert other.write(_batch(spark, "q-old")).rows == 2
    outcomes = sink.run_partitions(late)
    late.release()
    assert [(o.partition, o.status) for o in outcomes] == [(0, "failed")]
    failure = outcomes[0].failure
    assert failure is not None
    assert failure.message == (
        "MarkConflict: fanout's progress table (fanout.progress) already marks batch 0 "
        "partition 0 as committed by query q-old with 1 partitions; this is query q-new "
        "with 1. Nothing of this partition was written. If option 'partitions' changed "
        "mid-batch, restore it until the batch completes. Else the pipeline's checkpoint "
        "(and ledger) were replaced and it starts again under the same name: restore the "
        "ledger and checkpoint, or give the pipeline a new name. Deleting the earlier run's "
        f"marks lets this run write under the same name: {DELETE}; but the rows the "
        "earlier run appended to t stay there, and a batch reading the same "
        "input again appends them a second time"
    ), failure.message
    assert _table(pg_url) == [(1, "a"), (2, "b")]
    other.close()
