"""Input generation, stream running and independent reads shared by the integration
tests and the subprocess driver (no fanout code is used to check results)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fanout.testing import RecordingSink
from fanout.testing.faults import DownWhile

SCHEMA = "order_id LONG, customer STRING, amount DOUBLE, status STRING"
STATUSES = ("new", "paid", "shipped")
EPOCH = 1_700_000_000  # input file n is modified at EPOCH + n seconds


def pipeline_file(
    data: Path,
    name: str,
    schema: str,
    sinks: str,
    *,
    available_now: bool = False,
    master: str | None = None,
) -> str:
    """The text of a pipeline file (``fanout run``'s) of pipeline ``name``, its ledger and
    checkpoint under ``data``, reading the JSON files of ``schema`` in ``data/input`` into
    ``sinks`` (their ``[[sinks]]`` tables); ``available_now``: a run reads what is there
    and ends, without retries; ``master``: Spark's."""
    text = f'\n[pipeline]\nname = "{name}"\nledger = "{data}/ledger"\n'
    text += f'checkpoint = "{data}/checkpoint"\n'
    if available_now:
        text += "trigger = { available_now = true }\nretries = 0\n"
    if master is not None:
        text += f'\n[spark]\nmaster = "{master}"\n'
    text += f'\n[source]\nformat = "json"\npath = "{data}/input"\nschema = "{schema}"\n'
    return f"{text}\n{sinks}"


def backlog_pipeline(data: Path, name: str, sink: Mapping[str, Any]) -> Path:
    """``data/pipeline.toml``: pipeline ``name`` (:func:`pipeline_file`, available now, on
    ``local[2]``) reading one input file a batch into the one ``sink`` (its options:
    :func:`toml_value`'s): with several files waiting, Spark begins the next batch as soon
    as one ends."""
    table = "[[sinks]]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in sink.items())
    text = pipeline_file(data, name, SCHEMA, table, available_now=True, master="local[2]")
    config = data / "pipeline.toml"
    per_batch = '\noptions = { maxFilesPerTrigger = 1 }\nschema = "'
    config.write_text(text.replace('\nschema = "', per_batch))
    return config


def toml_value(value: Any) -> str:
    """``value`` (a text, number, boolean, or a mapping of them) as a TOML value: JSON's
    spelling of the scalars is TOML's, a mapping an inline table."""
    if isinstance(value, Mapping):
        pairs = (f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }"
    return json.dumps(value)


def bronze_pipeline(data: Path) -> str:
    """:func:`pipeline_file` of pipeline ``clicks``, run available now, writing the
    input of :data:`SCHEMA` into the Delta sink ``bronze`` at ``data/bronze``."""
    sink = f'[[sinks]]\ntype = "delta"\nname = "bronze"\npath = "{data}/bronze"\n'
    return pipeline_file(data, "clicks", SCHEMA, sink, available_now=True)


def order(order_id: int) -> dict[str, Any]:
    """The deterministic order row with this id."""
    return {
        "order_id": order_id,
        "customer": f"c{order_id % 7}",
        "amount": float(order_id % 100) + 0.5,
        "status": STATUSES[order_id % 3],
    }


def write_input(
    directory: Path, files: int, rows_per_file: int, start_file: int = 0
) -> list[dict[str, Any]]:
    """Write JSON-lines files ``orders-<n>.json``; file n becomes micro-batch n.

    The file source takes files oldest first and files written within one clock tick tie,
    so each file gets its own modification time, one second after the previous one.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in range(start_file, start_file + files):
        chunk = [order(f * rows_per_file + i) for i in range(rows_per_file)]
        path = directory / f"orders-{f:04d}.json"
        path.write_text("\n".join(json.dumps(r) for r in chunk) + "\n")
        os.utime(path, (EPOCH + f, EPOCH + f))
        rows.extend(chunk)
    return rows


def run_stream(
    spark: Any,
    input_dir: Path,
    fan: Any,
    checkpoint: Path,
    schema: str = SCHEMA,
    *,
    files_per_batch: int | None = 1,
    start: Callable[[Any], Any] = lambda writer: writer.start(),
) -> None:
    """Run the file stream through ``fan`` until the input is consumed (one file per
    batch, or every new file in one batch with ``files_per_batch=None``); raises the
    query's exception when it fails. ``start``: what starts the query's writer."""
    reader = spark.readStream.schema(schema)
    if files_per_batch is not None:
        reader = reader.option("maxFilesPerTrigger", files_per_batch)
    stream = reader.json(str(input_dir))
    query = start(
        stream.writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    query.awaitTermination()


def run_to_end(spark: Any, fan: Any, workdir: Path, schema: str = SCHEMA) -> str:
    """Run the file stream of ``workdir/input`` through ``fan`` on the checkpoint
    ``workdir/checkpoint`` (:func:`run_stream`), then close ``fan``: the text of the error
    the stream ended with, ``""`` when it ran to the end of its input."""
    try:
        run_stream(spark, workdir / "input", fan, workdir / "checkpoint", schema)
    except Exception as exc:  # Spark wraps the foreachBatch error
        return f"{type(exc).__name__}: {exc}"
    finally:
        fan.close()
    return ""


def delta_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of a Delta table, read with delta-rs."""
    from fanout.delta_tables.io import read_delta

    return read_delta(str(path)).to_pylist()


def id_counts(rows: list[dict[str, Any]]) -> Counter[int]:
    """How often each order id occurs."""
    return Counter(r["order_id"] for r in rows)


def committed_marks(ledger: Path, pipeline: str) -> Counter[tuple[str, int]]:
    """How many committed ledger rows each (sink, batch) has."""
    rows = delta_rows(ledger)
    return Counter(
        (r["sink"], r["batch_id"])
        for r in rows
        if r["pipeline"] == pipeline and r["status"] == "committed"
    )


def stopped_postgres(root: Path, database: str) -> tuple[Any, str]:
    """An embedded PostgreSQL server under ``root``, started once to create ``database``
    and stopped, and that database's URL (the same once the test starts it again)."""
    from fanout_postgres.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(root / "pgdata", database=database, durable=False)
    url = server.start()
    server.stop()
    return server, url


class DownSink(DownWhile, RecordingSink):
    """A recording sink whose target is down while ``down`` holds."""

    def __init__(self, name: str, *, down: bool) -> None:
        super().__init__(name)
        self.down = down
