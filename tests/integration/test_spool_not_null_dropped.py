"""A column the spool's table keeps ``NOT NULL`` (the first batch spooled had it
non-nullable: a literal, a ``range``'s column, a cast of one) dropped from the query while
a Delta sink lags: the batch without it is spooled (delta-rs' append refused it, "rows
failed validation check", and the query stopped) and the catch-up writes the lagging
table (its columns nullable) the rows a live Delta sink wrote. (A Delta table the sink
made keeps the column NOT NULL too, and refuses such a batch live and caught up alike.)
Real Spark, Delta sinks, ledger and spool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fanout_delta import DeltaSink

from fanout import BatchInfo, FanOut
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.testing.faults import DownWhile

SHAPES = [
    "SELECT id, CAST(id * 2 AS INT) AS a",  # a NOT NULL, as id
    "SELECT id, concat('b', id) AS b",  # a dropped, b added
    "SELECT id, CAST(id * 2 AS INT) AS a, concat('b', id) AS b",  # a back
]


class _DownDelta(DownWhile, DeltaSink):
    """The Delta sink whose storage is down while ``down`` holds."""

    down_message = "the storage is down"


def test_a_not_null_column_dropped_while_a_delta_sink_lags_reaches_it_as_written_live(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    # the targets keep the columns nullable (made before the stream): they take a batch
    # without "a"; the spool's table keeps it NOT NULL, as the first batch spooled had it
    nullable = pa.schema([("id", pa.int64()), ("a", pa.int32()), ("b", pa.string())])
    for name in ("live", "copy"):
        write_deltalake(str(tmp_path / name), nullable.empty_table())
    live = DeltaSink("live", path=str(tmp_path / "live"))
    lagging = _DownDelta("copy", path=str(tmp_path / "copy"))
    fan = FanOut(
        "notnull", str(tmp_path / "ledger"),
        [live, SinkSpec(lagging, lag=lag_policy("copy", {"on_failure": "lag"}))],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
    )  # fmt: skip
    try:
        for b, shape in enumerate(SHAPES):
            df = spark.sql(f"{shape} FROM range({b * 10}, {b * 10 + 3})")
            results = fan.process(df, BatchInfo("notnull", b, "q", [{"s": b}]))
            assert set(results) == {"live"}  # copy lags: the batch spooled for it
        lagging.down = False
        fan.final_catch_up()
    finally:
        fan.close()

    def rows(name: str) -> list[tuple[Any, ...]]:
        table = DeltaTable(str(tmp_path / name)).to_pyarrow_table().to_pylist()
        return sorted((r["id"], r.get("a"), r.get("b")) for r in table)

    assert rows("live") == [
        (0, 0, None), (1, 2, None), (2, 4, None),
        (10, None, "b10"), (11, None, "b11"), (12, None, "b12"),
        (20, 40, "b20"), (21, 42, "b21"), (22, 44, "b22"),
    ]  # fmt: skip
    assert rows("copy") == rows("live")
