"""The Delta + PostgreSQL + Kafka fan-out through a local Spark Connect server, run as a
subprocess: a Connect server started from Python lives in its own JVM gateway, which the
suite's classic SparkSession would collide with.

usage: python -m tests.connect.connect_driver WORKDIR PG_URL BOOTSTRAP

The foreachBatch function is the ``FanOut`` itself, pickled by the Connect client and run
in a Python process beside the server. Prints lines the test reads:

- ``CONFIG <message>``: a configuration error raised on the client, before any stream;
- ``CHECK <case> <result>``: ``FanOut.check_source`` on the client (:func:`source_checks`);
- ``FAILED <message, lines joined>``: a run of the query that failed (the PostgreSQL sink's
  partition 1 of batch 1 is vetoed once, after the other sinks wrote that batch);
- ``DONE <runs>``: the input is consumed;
- ``REFUSED <message, lines joined>``: a second query, whose Kafka key is computed with
  ``rand()``, refused before writing (the determinism check on the server's plan text);
- ``STOP <what>``: a third query with a backlog (one file a batch), stopped from the client
  while a batch is inside fanout's call (:func:`client_stops`); ``STOP SERVER <run>
  <events>``: what the ``FanOut`` built beside the server did to its sinks (opened, closed).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout import FanOut, hookimpl
from fanout.contract.partitions import PartitionCommit
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, SinkWriteError
from fanout.testing import RecordingSink
from tests.chaos.chaos_driver import sinks
from tests.integration.streams import SCHEMA, run_stream, write_input

PIPELINE = "connect"
STOP_FILES, STOP_ROWS = 5, 3


class VetoOnce:
    """Fails one partition's first commit of one batch (a non-transient error: the
    batch fails, the query stops, and the restart replays it). Its state is a file: it
    runs on the executors, pickled."""

    def __init__(self, state: str, sink: str, batch_id: int, partition: int) -> None:
        self.state, self.sink, self.batch_id, self.partition = state, sink, batch_id, partition

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        """Veto the chosen partition, once."""
        chosen = (commit.sink, commit.batch_id, commit.partition)
        if chosen == (self.sink, self.batch_id, self.partition) and not Path(self.state).exists():
            Path(self.state).write_text("vetoed")
            raise SinkWriteError("vetoed once by the test", sink=commit.sink,
                                 batch_id=commit.batch_id)  # fmt: skip


class HoldAt:
    """Holds batch ``batch_id`` as it starts (once), until the client writes the file
    ``release-<batch_id>`` in ``workdir``, having written ``entered-<batch_id>``: the client's
    stop lands while that batch is inside fanout's call, placed by files, not by timing."""

    def __init__(self, workdir: str, batch_id: int) -> None:
        self.workdir, self.batch_id = Path(workdir), batch_id

    @hookimpl
    def fanout_batch_start(self, info: Any, pending: Any, skipped: Any) -> None:
        """Hold the chosen batch until released (60 s at most)."""
        entered = self.workdir / f"entered-{info.batch_id}"
        if info.batch_id != self.batch_id or entered.exists():
            return
        entered.write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not (self.workdir / f"release-{info.batch_id}").exists():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


class NotedSink(RecordingSink):
    """Appends ``open <pid>`` and ``close <pid>`` to the file ``note`` as it is opened and
    closed: the client's ``FanOut`` and the one built beside the server (another process)
    each open their copy."""

    def __init__(self, name: str, note: str) -> None:
        super().__init__(name)
        self.note = note

    def _say(self, what: str) -> None:
        with open(self.note, "a") as out:
            out.write(f"{what} {os.getpid()}\n")

    def open(self, context: SinkContext) -> None:
        """Note it, then open."""
        self._say("open")
        super().open(context)

    def close(self) -> None:
        """Note it, then close."""
        self._say("close")
        super().close()


def server_events(note: Path) -> list[str]:
    """What the processes other than this one (the server's ``FanOut``) noted, in order;
    the note emptied."""
    lines = note.read_text().splitlines() if note.exists() else []
    note.write_text("")
    return [line.split()[0] for line in lines if line.split()[1] != str(os.getpid())]


def connect_session() -> Any:
    """A local Spark Connect server and a client session on it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the server's Python workers
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.remote("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def config_errors(workdir: Path, pg_url: str, bootstrap: str) -> None:
    """Configuration errors surface on the client, before the stream starts."""
    ledger = str(workdir / "ledger")
    bad_route = [{**s, "where": "amount >"} if s["name"] == "pg" else s
                 for s in sinks(workdir, pg_url, bootstrap)]  # fmt: skip
    for label, build in [
        ("no checkpoint", lambda: FanOut(PIPELINE, ledger, sinks(workdir, pg_url, bootstrap))),
        ("bad route", lambda: FanOut(PIPELINE, ledger, bad_route,
                                      checkpoint_location=str(workdir / "checkpoint"))),
    ]:  # fmt: skip
        try:
            build()
            print(f"NO ERROR {label}", flush=True)
        except ConfigurationError as exc:
            print(f"CONFIG {exc}".splitlines()[0], flush=True)


def source_checks(spark: Any, workdir: Path) -> None:
    """``FanOut.check_source`` on the client, against Connect streaming DataFrames (no JVM
    object at hand): ``CHECK <case> passed`` or ``CHECK <case> <message, lines joined>``
    for a pipeline that fits, one with a misspelt key, a ``where`` and a ``select`` that do
    not resolve, and one whose partitioning key is computed with ``rand()``; then
    ``CHECK wrote <what is under its directory>``."""
    from pyspark.sql import functions as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from partitioned_sink import PartitionedFilesSink

    root = workdir / "source-checks"
    write_input(root / "input", 1, 2)
    stream = spark.readStream.schema(SCHEMA).json(str(root / "input"))
    volatile = stream.withColumn("order_id", F.expr("cast(rand() * 1000 as long)"))

    def delta(name: str, **route: Any) -> dict[str, Any]:
        return {"type": "delta", "name": name, "path": str(root / name), **route}

    def files() -> PartitionedFilesSink:
        return PartitionedFilesSink("files", directory=str(root / "files"), key="order_id")

    good = [delta("bronze"), delta("latest", mode="merge", keys=["order_id"]),
            delta("big", where="amount > 10", select=["order_id", "amount * 100 AS cents"]),
            files()]  # fmt: skip
    bad = [delta("latest", mode="merge", keys=["orderid"]), delta("big", where="amout > 10"),
           delta("slim", select=["order_id", "amout * 100 AS cents"])]  # fmt: skip
    cases = [("good", good, stream), ("bad", bad, stream), ("volatile", [files()], volatile)]
    for label, chosen, df in cases:
        with FanOut("source-checks", str(root / "ledger"), chosen,
                    checkpoint_location=str(root / "checkpoint")) as fan:  # fmt: skip
            try:
                fan.check_source(df)
                print(f"CHECK {label} passed", flush=True)
            except ConfigurationError as exc:
                print(f"CHECK {label} " + " | ".join(str(exc).splitlines()), flush=True)
    print(f"CHECK wrote {sorted(p.name for p in root.iterdir())}", flush=True)


def volatile_key(spark: Any, workdir: Path, bootstrap: str) -> None:
    """A Kafka sink keyed by a column computed with ``rand()``: refused at its first batch."""
    from pyspark.sql import functions as F

    bus = [{"type": "kafka", "name": "bus", "bootstrap_servers": bootstrap,
            "topic": "connect-volatile", "key": "order_id", "partitions": 2,
            "create_topic": True}]  # fmt: skip
    checkpoint = workdir / "volatile-checkpoint"
    fan = FanOut("volatile", str(workdir / "volatile-ledger"), bus, retries=0,
                 checkpoint_location=str(checkpoint))  # fmt: skip
    stream = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
        .json(str(workdir / "input"))
        .withColumn("order_id", F.expr("cast(rand() * 1000 as long)"))
    )  # fmt: skip
    writer = (
        stream.writeStream.foreachBatch(fan).option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )  # fmt: skip
    for attempt in range(1, LATE_STARTS + 2):
        try:
            start_query(writer).awaitTermination()
            print("NOT REFUSED", flush=True)
        except Exception as exc:
            if worker_late(exc) and attempt <= LATE_STARTS:
                print(f"RETRY run {attempt}: the foreachBatch process connected late", flush=True)
                continue
            print("REFUSED " + " | ".join(str(exc).strip().splitlines()), flush=True)
        break


WORKER_LATE = (
    "Timed out while waiting for the Python worker to connect back",
    "Python worker failed to connect back",
)
"""Spark's errors when the foreachBatch process it starts for a query has not connected
back within 10 s (``PythonWorkerFactory.createSimpleWorker``: a constant, no setting): on a
loaded machine its imports alone (pyspark's worker, the Connect client: grpc, pandas,
pyarrow) can take that long. Raised by ``start()``; seen as a running query's error too
(at a load of 15-20, the Python worker of its origin not looked at)."""
LATE_STARTS = 4
"""How many times a query whose foreachBatch process connected late is started again: a
process that never connects (a hang, a crash at its start) still fails the last start."""


def worker_late(error: BaseException) -> bool:
    """Whether ``error`` is Spark's foreachBatch process connecting back late."""
    return any(text in str(error) for text in WORKER_LATE)


def start_query(writer: Any) -> Any:
    """``writer.start()``, started again (:data:`LATE_STARTS` times at most) when Spark's
    foreachBatch process connected back late (:func:`worker_late`): nothing of the query
    ran. Says ``RETRY`` when it retries."""
    for attempt in range(1, LATE_STARTS + 2):
        try:
            return writer.start()
        except Exception as exc:
            if not worker_late(exc) or attempt > LATE_STARTS:
                raise
            print(f"RETRY start {attempt}: the foreachBatch process connected late", flush=True)
    raise AssertionError("unreachable")


def started_until(start: Callable[[], Any], entered: Path) -> Any:
    """``start()``'s query once its batch wrote ``entered``; started again
    (:data:`LATE_STARTS` times at most) when it ended first, on its foreachBatch process
    connecting back late (nothing of it ran: that process runs every batch)."""
    for attempt in range(1, LATE_STARTS + 2):
        started = start()
        query = started[1]
        deadline = time.monotonic() + 120
        while not entered.exists():
            if not query.isActive:
                error = query.exception()
                if error is None or not worker_late(error) or attempt > LATE_STARTS:
                    raise RuntimeError(f"the query ended before {entered.name}: {error}")
                print(f"RETRY run {attempt}: the foreachBatch process connected late", flush=True)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{entered} never appeared")
            time.sleep(0.05)
        else:
            return started
    raise AssertionError("unreachable")


def _committed(checkpoint: Path) -> list[int]:
    return sorted(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())


def _ended(pid: int, timeout_s: float) -> bool:
    """Whether process ``pid`` ended within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _ledger_rows(ledger: Path, pipeline: str, batch_id: int) -> list[tuple[str, str, str]]:
    """The ledger's rows of ``batch_id``: sink, status and the error's type."""
    from fanout.ledger.delta import DeltaLedger
    from fanout.ledger.entry import entries_from_arrow

    rows = entries_from_arrow(DeltaLedger(str(ledger)).read(pipeline))
    return sorted((e.sink, e.status, (e.error or "").split(":")[0])
                  for e in rows if e.batch_id == batch_id)  # fmt: skip


def _timing(spark: Any, query: Any) -> None:
    """``TIMING``: what the stop check costs a batch under Connect (one option read, here
    from the client: the same round trip to the server) against what Spark measured of the
    batches (``addBatch``, the foreachBatch call, and the whole trigger), in ms."""
    started = time.perf_counter()
    for _ in range(50):
        spark.conf.get("fanout.stop.timing", None)
    read_ms = (time.perf_counter() - started) * 1000 / 50
    runs = [(p["batchId"], p["durationMs"].get("addBatch"), p["durationMs"].get("triggerExecution"))
            for p in query.recentProgress]  # fmt: skip
    print(f"TIMING option read {read_ms:.1f} ms; batch, addBatch, trigger: {runs}", flush=True)


def client_stops(spark: Any, workdir: Path) -> None:
    """A Delta sink written from the executors, input of 5 files read one a batch (a
    backlog: Spark begins the next batch as soon as one ends), two runs on one
    checkpoint:

    1. batch 1 held inside the call; ``request_stop()`` without the query says what to do
       (``STOP NO QUERY``); ``request_stop(query)``, then batch 1 is released: it finishes,
       batch 2 is refused, the query ends by itself (``STOP REFUSED``);
    2. the restart writes batch 2; batch 3 held; ``stop_query(query)`` from another thread;
       released once the request reached the session: ``STOP CLEAN``, with what the
       query's error was (batch 4, if Spark began it meanwhile, refused);
    3. the restart holds batch 4 inside the call and ``query.stop()`` stops it there (Spark
       ends the foreachBatch process with SIGTERM): ``STOP KILLED`` says whether that
       process ended, ``STOP LEDGER 4`` what the ledger holds of batch 4.

    ``STOP COMMITS <run> <batches>`` says which batches Spark committed after each run."""
    from pyspark.sql.utils import StreamingQueryException

    from fanout import is_stop_refusal
    from fanout.steps.stop_gate import client_stop_key

    began = time.monotonic()
    root = workdir / "stop"
    write_input(root / "input", STOP_FILES, STOP_ROWS)
    checkpoint = root / "checkpoint"
    lake = {"type": "delta", "name": "lake", "path": str(root / "lake"),
            "write_from": "executors"}  # fmt: skip
    note = root / "opened-closed"

    def start(hold: int) -> tuple[FanOut, Any]:
        noted = NotedSink("noted", str(note))
        fan = FanOut("connect-stop", str(root / "ledger"), [lake, noted],
                     plugins=[HoldAt(str(root), hold)], retries=0,
                     checkpoint_location=str(checkpoint))  # fmt: skip
        stream = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                  .json(str(root / "input")))  # fmt: skip
        writer = stream.writeStream.foreachBatch(fan).option("checkpointLocation", str(checkpoint))
        return fan, start_query(writer.trigger(processingTime="0 seconds"))

    # 1. request_stop(query): the batch inside finishes, the next one is refused
    fan, query = started_until(lambda: start(hold=1), root / "entered-1")
    # what stop_query waits on: the trigger is active while a batch is inside the call
    print(f"STOP HELD trigger active: {query.status['isTriggerActive']}", flush=True)
    try:
        fan.request_stop()
        print("STOP NOT REFUSED without the query", flush=True)
    except ConfigurationError as exc:
        print(f"STOP NO QUERY {exc}", flush=True)
    fan.request_stop(query)
    (root / "release-1").write_text("go")
    try:
        query.awaitTermination(120)
        print(f"STOP NOT ENDED active={query.isActive}", flush=True)
        query.stop()
    except StreamingQueryException as exc:  # what a library user catches: a clean stop
        text = " | ".join(str(exc).strip().splitlines())
        print(f"STOP REFUSED {is_stop_refusal(exc)} {text}", flush=True)
    _timing(spark, query)
    fan.close()
    print(f"STOP COMMITS 1 {_committed(checkpoint)}", flush=True)
    print(f"STOP SERVER 1 {server_events(note)}", flush=True)

    # 2. the restart writes batch 2; stop_query(query) while batch 3 is inside: it waits
    # for batch 3, then stops the query
    fan, query = started_until(lambda: start(hold=3), root / "entered-3")
    stopped: list[bool] = []
    stopper = threading.Thread(target=lambda: stopped.append(fan.stop_query(query, 120)))
    stopper.start()
    deadline = time.monotonic() + 60
    while spark.conf.get(client_stop_key("connect-stop"), None) != str(query.runId):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    (root / "release-3").write_text("go")
    stopper.join(180)
    error = query.exception()
    text = "none" if error is None else " | ".join(str(error).strip().splitlines())
    print(f"STOP CLEAN {stopped} {is_stop_refusal(error)} error: {text}", flush=True)
    _timing(spark, query)
    fan.close()
    print(f"STOP COMMITS 2 {_committed(checkpoint)}", flush=True)
    print(f"STOP SERVER 2 {server_events(note)}", flush=True)

    # 3. query.stop() itself while batch 4 is held inside the call: Spark ends the
    # foreachBatch process (SIGTERM) in the middle of the batch
    fan, query = started_until(lambda: start(hold=4), root / "entered-4")
    worker = int((root / "entered-4").read_text())
    query.stop()
    ended = _ended(worker, 120)
    fan.close()
    print(f"STOP KILLED ended: {ended}; active: {query.isActive}", flush=True)
    print(f"STOP COMMITS 3 {_committed(checkpoint)}", flush=True)
    print(f"STOP SERVER 3 {server_events(note)}", flush=True)
    print(f"STOP LEDGER 4 {_ledger_rows(root / 'ledger', 'connect-stop', 4)}", flush=True)
    print(f"TIMING the stop phase took {time.monotonic() - began:.0f} s", flush=True)


def main() -> None:
    """Check the client-side errors, then run the stream to the end of its input."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("pg_url")
    parser.add_argument("bootstrap")
    args = parser.parse_args()
    spark = connect_session()
    config_errors(args.workdir, args.pg_url, args.bootstrap)
    source_checks(spark, args.workdir)
    veto = VetoOnce(str(args.workdir / "vetoed"), "pg", 1, 1)
    checkpoint = args.workdir / "checkpoint"
    fan = FanOut(
        PIPELINE,
        str(args.workdir / "ledger"),
        sinks(args.workdir, args.pg_url, args.bootstrap, lake_from="executors"),
        plugins=[veto],
        retries=0,
        checkpoint_location=str(checkpoint),
    )
    runs, late = 0, 0
    while runs < 3:
        runs += 1
        try:
            run_stream(spark, args.workdir / "input", fan, checkpoint, start=start_query)
            break
        except Exception as exc:
            if worker_late(exc) and late < LATE_STARTS:  # not a run: the restart replays
                late, runs = late + 1, runs - 1
                print(f"RETRY run {late}: the foreachBatch process connected late", flush=True)
                continue
            print("FAILED " + " | ".join(str(exc).strip().splitlines()), flush=True)
    print(f"DONE {runs}", flush=True)
    fan.close()
    volatile_key(spark, args.workdir, args.bootstrap)
    client_stops(spark, args.workdir)
    spark.stop()


if __name__ == "__main__":
    main()
