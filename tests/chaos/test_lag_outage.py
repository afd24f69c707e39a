"""A sink that fails alone (``on_failure="lag"``): PostgreSQL stops for several batches
mid-stream. Delta and Kafka receive every batch while it is down, Spark commits every
batch, status shows the lag; once the server is back the PostgreSQL sink catches up from
the spool in batch order, and independent readers find every row once in every sink and
the upsert table as an unfailing run leaves it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafkatools import create_topic

from fanout import FanOut, hookimpl
from fanout.app.status import report
from fanout.contract.batch import BatchInfo
from fanout.contract.lag import SinkLag, SpoolSize
from fanout.ledger.delta import DeltaLedger
from tests.chaos.lag_input import (
    LAG_SCHEMA,
    final_state,
    kafka_rows,
    postgres_rows,
    versions,
    write_lag_input,
)
from tests.integration.streams import delta_rows, run_stream

PIPELINE = "lagout"
FILES = 8
DOWN_AT, UP_AT = 2, 5  # the server stops when batch 2 starts, is back when batch 5 starts


class Outage:
    """Stops the PostgreSQL server when batch ``down`` starts and starts it again when
    batch ``up`` starts; records what every batch's lag hook said and the status output
    while the server is down."""

    def __init__(self, server: Any, down: int, up: int, ledger: str, spool: str) -> None:
        self.server, self.down, self.up = server, down, up
        self.ledger, self.spool = ledger, spool
        self.lags: dict[int, dict[str, SinkLag]] = {}
        self.status_while_down: str | None = None

    @hookimpl
    def fanout_batch_start(self, info: BatchInfo, pending: Any, skipped: Any) -> None:
        """Pull the plug, or put it back."""
        if info.batch_id == self.down:
            self.server.stop()
        elif info.batch_id == self.up:
            self.status_while_down = report(DeltaLedger(self.ledger), PIPELINE, spool=self.spool)
            self.server.start()

    @hookimpl
    def fanout_sink_lag(
        self, info: BatchInfo, lags: Mapping[str, SinkLag], spool: SpoolSize | None
    ) -> None:
        """Keep what each live batch said of the lagging sink."""
        self.lags.setdefault(info.batch_id, dict(lags))


def _fan(tmp: Path, pg_url: str, bootstrap: str, plugins: list[object]) -> FanOut:
    return FanOut(
        PIPELINE,
        str(tmp / "ledger"),
        [
            {"type": "delta", "name": "lake", "path": str(tmp / "lake")},
            {
                "type": "postgres",
                "name": "pg",
                "url": pg_url,
                "table": "lag_orders",
                "keys": ["order_id"],
                "create_table": True,
                "partitions": 2,
                "on_failure": "lag",
                "retries": 1,
                "backoff_s": 0.1,
            },
            {
                "type": "kafka",
                "name": "bus",
                "bootstrap_servers": bootstrap,
                "topic": "lag-orders",
                "key": "order_id",
                "partitions": 2,
            },
        ],
        spool=str(tmp / "spool"),
        probe_interval_s=0.5,
        plugins=plugins,
    )


def test_postgres_outage_lags_alone_and_catches_up_in_order(spark: Any, tmp_path: Path) -> None:
    from fanout_kafka.embedded import EmbeddedKafka
    from fanout_postgres.embedded import EmbeddedPostgres

    rows = write_lag_input(tmp_path / "input", FILES)
    server = EmbeddedPostgres(tmp_path / "pgdata", database="lagout", durable=False)
    kafka = EmbeddedKafka()
    pg_url, bootstrap = server.start(), kafka.start()
    try:
        create_topic(bootstrap, "lag-orders", 2)
        outage = Outage(server, DOWN_AT, UP_AT, str(tmp_path / "ledger"), str(tmp_path / "spool"))
        fan = _fan(tmp_path, pg_url, bootstrap, [outage])
        run_stream(spark, tmp_path / "input", fan, tmp_path / "ckpt", LAG_SCHEMA)  # no raise

        # Spark committed every batch while PostgreSQL was down
        assert sorted(int(p.name) for p in (tmp_path / "ckpt" / "commits").iterdir()
                      if p.name.isdigit()) == list(range(FILES))  # fmt: skip
        # the lag was visible while it lasted, growing one batch at a time
        assert {b: outage.lags[b]["pg"].state for b in range(DOWN_AT, UP_AT)} == {
            b: "lagging" for b in range(DOWN_AT, UP_AT)
        }
        assert [outage.lags[b]["pg"].batches for b in range(DOWN_AT, UP_AT)] == [1, 2, 3]
        assert outage.status_while_down is not None
        assert "pg" in outage.status_while_down
        assert "lagging 3 batches" in outage.status_while_down, outage.status_while_down

        fan.catch_up(timeout_s=120)
        assert {name: lag.state for name, lag in fan.lagging.lags().items()} == {"pg": "live"}
        assert fan.spool is not None and fan.spool.size() == (0, 0, 0)
        fan.close()

        expected = versions(rows)
        assert versions(delta_rows(tmp_path / "lake")) == expected
        records, _stuck = kafka_rows(bootstrap, "lag-orders", len(rows))
        assert versions(records) == expected  # no kill: no aborted record even if read uncommitted
        assert postgres_rows(pg_url, "lag_orders") == {
            k: {**v, "amount": v["amount"]} for k, v in final_state(rows).items()
        }
        # in batch order: the PostgreSQL sink's marks were committed 0, 1, 2, ... 7
        ledger = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"]
        pg_marks = [r["batch_id"] for r in sorted(ledger, key=lambda r: r["finished_at"])
                    if r["sink"] == "pg"]  # fmt: skip
        assert pg_marks == list(range(FILES))
        lake_marks = sorted(r["batch_id"] for r in ledger if r["sink"] == "lake")
        assert lake_marks == list(range(FILES))
    finally:
        kafka.stop()
        server.stop()


def test_past_max_lag_the_query_stops_naming_the_sink_and_restarts_without_loss(
    spark: Any, tmp_path: Path
) -> None:
    import pytest
    from fanout_postgres.embedded import EmbeddedPostgres
    from pyspark.errors import StreamingQueryException

    rows = write_lag_input(tmp_path / "input", 6)
    server = EmbeddedPostgres(tmp_path / "pgdata", database="maxlag", durable=False)
    pg_url = server.start()

    def fan(plugins: list[object]) -> FanOut:
        return FanOut(
            "maxlag",
            str(tmp_path / "ledger"),
            [
                {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
                {
                    "type": "postgres",
                    "name": "pg",
                    "url": pg_url,
                    "table": "maxlag_orders",
                    "keys": ["order_id"],
                    "create_table": True,
                    "partitions": 2,
                    "on_failure": "lag",
                    "max_lag": 2,
                    "retries": 0,
                },
            ],
            spool=str(tmp_path / "spool"),
            probe_interval_s=60,  # no probe in between: only the limit's own attempt
            plugins=plugins,
        )

    try:
        down = Outage(server, 1, 99, str(tmp_path / "ledger"), str(tmp_path / "spool"))
        first = fan([down])
        with pytest.raises(StreamingQueryException) as stopped:
            run_stream(spark, tmp_path / "input", first, tmp_path / "ckpt", LAG_SCHEMA)
        first.close()  # its catch-up thread stops (a restart is a new FanOut)
        message = str(stopped.value)
        assert "LagLimitError" in message, message
        assert "sink 'pg' is 2 batch(es) / 40 row(s) behind" in message, message
        assert "past its max_lag (2 batches; now 3 batches > 2)" in message, message
        # batches 1 and 2 committed in Spark (pg lagging), batch 3 stopped the query
        commits = sorted(int(p.name) for p in (tmp_path / "ckpt" / "commits").iterdir()
                         if p.name.isdigit())  # fmt: skip
        assert commits == [0, 1, 2]

        server.start()  # the sink is back: the restart catches up first, then goes on
        again = fan([])
        run_stream(spark, tmp_path / "input", again, tmp_path / "ckpt", LAG_SCHEMA)
        again.catch_up(timeout_s=60)
        again.close()
        assert postgres_rows(pg_url, "maxlag_orders") == final_state(rows)
        assert versions(delta_rows(tmp_path / "lake")) == versions(rows)
        marks = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"]
        assert sorted(r["batch_id"] for r in marks if r["sink"] == "pg") == list(range(6))
        assert sorted(r["batch_id"] for r in marks if r["sink"] == "lake") == list(range(6))
    finally:
        server.stop()
