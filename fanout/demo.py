"""``fanout demo``: a failure mid-stream, a restart, and proof of no loss and no duplicate.

Generates JSON order files, streams them (one file per micro-batch) into two Delta sinks
(``bronze``: append; ``latest``: merge of each customer's latest order) and the ledger.
``latest`` fails at batch 3 on its first attempt, which fails the query; the demo then
restarts the query on the same checkpoint, and checks every sink independently of fanout.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fanout.errors import ConfigurationError
from fanout.hookspecs import hookimpl
from fanout.sink import BatchInfo, SinkResult
from fanout.status import format_table

FAILING_SINK = "latest"
FAILING_BATCH = 3
CUSTOMERS = 40


class Progress:
    """A lifecycle-hook observer printing what happens, batch by batch."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def _say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f}s] {text}", flush=True)

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """Announce the batch and the plan."""
        note = f" (skipping {', '.join(skipped)}: already committed)" if skipped else ""
        self._say(f"batch {info.batch_id}: writing {', '.join(pending) or 'nothing'}{note}")

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """One sink wrote the batch."""
        self._say(f"  {sink}: {result.rows} rows in {duration_s * 1000:.0f} ms")

    @hookimpl
    def fanout_sink_error(
        self, info: BatchInfo, sink: str, error: BaseException, attempt: int, will_retry: bool
    ) -> None:
        """One sink failed an attempt."""
        self._say(f"  {sink}: FAILED ({error}){' - retrying' if will_retry else ''}")

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """The batch is committed everywhere."""
        self._say(f"batch {info.batch_id}: committed in every sink")


def generate_input(directory: Path, files: int, rows_per_file: int) -> list[dict[str, Any]]:
    """Write ``files`` JSON-lines files of orders; return every row written."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    start = time.time() - files
    for f in range(files):
        chunk = [
            {
                "order_id": f * rows_per_file + i,
                "customer": f"c{(f * rows_per_file + i) % CUSTOMERS:03d}",
                "amount": round(((f * rows_per_file + i) * 7919 % 10000) / 100, 2),
            }
            for i in range(rows_per_file)
        ]
        path = directory / f"orders-{f:03d}.json"
        path.write_text("\n".join(json.dumps(r) for r in chunk))
        # The file source takes the oldest file first; files written in one clock tick
        # would tie, and "latest" must see the orders in file order.
        os.utime(path, (start + f, start + f))
        rows.extend(chunk)
    return rows


def _pipeline(workdir: Path, progress: Progress) -> Any:
    from fanout.dispatcher import FanOut
    from fanout.registry import load_registry
    from fanout.testing import FlakySink

    types = load_registry().sink_types()
    delta: Any = types["delta"].sink_class  # options are the plugin's, unknown to Sink
    latest = delta(
        name=FAILING_SINK,
        path=str(workdir / "latest"),
        mode="merge",
        keys=["customer"],
        order_by="order_id",
    )
    return FanOut(
        pipeline="demo",
        ledger=str(workdir / "_fanout_ledger"),
        sinks=[
            {"type": "delta", "name": "bronze", "path": str(workdir / "bronze")},
            FlakySink(
                latest,
                fail_on=[FAILING_BATCH],
                state_path=workdir / "outage.json",
                message="simulated outage of the 'latest' table",
            ),
        ],
        retries=0,
        plugins=[progress],
    )


def _run_query(spark: Any, workdir: Path, fan: Any) -> None:
    stream = (
        spark.readStream.schema("order_id LONG, customer STRING, amount DOUBLE")
        .option("maxFilesPerTrigger", 1)
        .json(str(workdir / "input"))
    )
    query = (
        stream.writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def check_sinks(workdir: Path, rows: list[dict[str, Any]]) -> list[list[Any]]:
    """Per sink: expected, present, missing, duplicated, wrong — read with delta-rs."""
    from deltalake import DeltaTable

    bronze = DeltaTable(str(workdir / "bronze")).to_pyarrow_table().to_pylist()
    counts = Counter(r["order_id"] for r in bronze)
    expected_ids = {r["order_id"] for r in rows}
    bronze_row = [
        "bronze",
        "append",
        len(expected_ids),
        len(bronze),
        len(expected_ids - counts.keys()),
        sum(c - 1 for c in counts.values() if c > 1),
        0,
    ]
    winners: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["customer"] not in winners or r["order_id"] > winners[r["customer"]]["order_id"]:
            winners[r["customer"]] = r
    latest = DeltaTable(str(workdir / "latest")).to_pyarrow_table().to_pylist()
    keys = Counter(r["customer"] for r in latest)
    wrong = sum(1 for r in latest if winners.get(r["customer"]) != r)
    latest_row = [
        "latest",
        "merge",
        len(winners),
        len(latest),
        len(winners.keys() - keys.keys()),
        sum(c - 1 for c in keys.values() if c > 1),
        wrong,
    ]
    return [bronze_row, latest_row]


def run_demo(workdir: str | None = None, rows_per_file: int = 500, files: int = 6) -> int:
    """Run the demo; return 0 when every sink holds exactly the expected rows."""
    if files < FAILING_BATCH + 2:
        raise ConfigurationError(
            f"--batches must be at least {FAILING_BATCH + 2}: the demo fails batch "
            f"{FAILING_BATCH} and shows the batches after it"
        )
    if rows_per_file < 1:
        raise ConfigurationError("--rows must be at least 1")
    from fanout.ledger import DeltaLedger
    from fanout.spark import local_session
    from fanout.status import render, summarize

    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fanout-demo-"))
    if root.exists() and any(root.iterdir()):
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    progress._say(f"working in {root}")
    rows = generate_input(root / "input", files, rows_per_file)
    progress._say(f"generated {len(rows)} orders in {files} files (one micro-batch each)")
    progress._say("starting a local Spark session (about 10 s)...")
    spark = local_session("fanout-demo")
    spark.sparkContext.setLogLevel("OFF")

    progress._say(f"run 1: sink {FAILING_SINK!r} will fail at batch {FAILING_BATCH}")
    try:
        _run_query(spark, root, _pipeline(root, progress))
        progress._say("run 1 finished without the planned failure?")
    except Exception as exc:
        first = next((line for line in str(exc).splitlines() if "sink(s) failed" in line), "")
        progress._say(
            "run 1: the query stopped, as planned: "
            + (first.strip().removeprefix("fanout.errors.") or type(exc).__name__)
        )
    progress._say("run 2: restarting on the same checkpoint; Spark replays the failed batch")
    _run_query(spark, root, _pipeline(root, progress))

    table = check_sinks(root, rows)
    print()
    print(
        format_table(
            ["sink", "mode", "expected", "present", "missing", "duplicated", "wrong"], table
        )
    )
    print()
    print("ledger (fanout status --ledger " + str(root / "_fanout_ledger") + "):")
    print(render(summarize(DeltaLedger(str(root / "_fanout_ledger")).read("demo").to_pylist())))
    ok = all(row[2] == row[3] and row[4] == row[5] == row[6] == 0 for row in table)
    print()
    print(
        "OK: no row lost, none duplicated, in any sink." if ok else "FAILED: see the table above."
    )
    spark.stop()
    return 0 if ok else 1
