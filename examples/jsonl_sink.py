"""A sink of your own, end to end: one JSON-lines file per batch, fed by a real stream.

Run it: ``python examples/jsonl_sink.py WORKDIR`` (again with ``--new-epoch`` after deleting
WORKDIR/checkpoint, to see a new epoch write beside the old one's files).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from fanout import (
    Batch,
    ConfigurationError,
    FanOut,
    Reads,
    Sink,
    SinkContext,
    SinkOption,
    SinkResult,
    hookimpl,
)


class JsonLinesSink(Sink):
    """One JSON-lines file per batch; writing a batch again replaces its file (idempotent)."""

    guarantees = ("idempotent",)  # a replay leaves the same state: `fanout plugins` shows it
    options = (SinkOption("directory", "required", "where the batch files go"),)
    # `fanout validate` opens a sink only when its type says open() honours
    # context.checking: then open() checks, creates nothing, and says what a run would.
    read_only_check = True

    def __init__(self, name: str, *, directory: str | None = None) -> None:
        super().__init__(name)
        # Configuration only: a sink is pickled to the executors when it writes from there,
        # so open files, connections and clients belong in write(), never in __init__.
        self.directory = directory or ""  # open() refuses it empty

    @property
    def reads(self) -> Reads:
        # "arrow": batch.arrow() is one Arrow table shared by every Arrow-reading sink.
        # "dataframe" (the default): use batch.df, the (persisted) Spark DataFrame.
        return "arrow"

    def open(self, context: SinkContext) -> None:
        # Once, on the driver, inside FanOut(...): fail here, before the stream starts.
        # context.pipeline is the pipeline name; context.spark the SparkSession (or None).
        if not self.directory:
            raise ConfigurationError(f"sink {self.name!r}: option 'directory' is required")
        directory = Path(self.directory)
        if not directory.is_dir():  # created at the first write, not here (README: open())
            existing = next(p for p in [directory, *directory.parents] if p.exists())
            if not existing.is_dir() or not os.access(existing, os.W_OK):
                raise ConfigurationError(
                    f"sink {self.name!r}: cannot create directory {directory} ({existing} "
                    + ("is not writable)" if existing.is_dir() else "is a file)")
                )
            if context.checking:  # fanout validate: say what the first write will do
                context.would(f"create directory {directory}")

    def write(self, batch: Batch) -> SinkResult:
        # batch.batch_id, batch.pipeline, batch.query_id, batch.sink_name, batch.attempt,
        # batch.df, batch.arrow(); batch.idempotency_key names this batch for this sink in
        # this epoch: a replay gets the same key, a new epoch a new one.
        rows = batch.arrow().to_pylist()
        final = Path(self.directory) / f"{batch.idempotency_key.token}.jsonl"
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
        os.replace(tmp, final)  # atomic: a replay overwrites, never duplicates
        return SinkResult(rows=len(rows))

    def close(self) -> None:
        # When the pipeline stops (FanOut.close()): release what write() kept open.
        pass


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """The sink types of this plugin (registered under the `fanout` entry point)."""
    return {"jsonl": JsonLinesSink}


def main() -> None:
    """Stream the JSON files of WORKDIR/input through FanOut into WORKDIR/out."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--new-epoch", action="store_true")
    args = parser.parse_args()
    work = args.workdir
    inbox = work / "input"
    inbox.mkdir(parents=True, exist_ok=True)
    start = len(list(inbox.glob("*.json")))
    for n in range(start, start + 2):  # two new files: two micro-batches
        rows = [{"order_id": 10 * n + i, "amount": 1.5 * i} for i in range(3)]
        (inbox / f"orders-{n:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))

    from fanout.spark import local_session  # a local SparkSession set up for fanout

    spark = local_session("jsonl-example")
    fan = FanOut(
        pipeline="orders",
        ledger=str(work / "ledger"),
        sinks=[JsonLinesSink("raw", directory=str(work / "out"))],
        on_checkpoint_reset="new_epoch" if args.new_epoch else "refuse",
    )
    stream = (
        spark.readStream.schema("order_id BIGINT, amount DOUBLE")
        .option("maxFilesPerTrigger", 1)
        .json(str(inbox))
    )
    fan.check_source(stream)  # each sink against the stream's columns, before it starts
    query = (
        stream.writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # availableNow: stops by itself once the input is read
    fan.close()
    for path in sorted((work / "out").glob("*.jsonl")):
        print(path.name, len(path.read_text().splitlines()))
    spark.stop()


if __name__ == "__main__":
    main()
