"""The pipeline under chaos, run as a subprocess so it can be SIGKILLed.

usage: python -m tests.chaos.chaos_driver WORKDIR PG_URL BOOTSTRAP [--kill JSON] [--lag]
       [--master MASTER] [--append] [--executor-kills JSON]

With ``--lag`` the PostgreSQL sink has ``on_failure="lag"`` (its server flaps in the lag
chaos runs) and the run ends by catching up whatever the sink still misses.

On a ``local-cluster`` master (``--master``, :func:`fanout.spark.cluster_master`) the
executors are other JVMs: ``--executor-kills`` (a list of
:class:`tests.chaos.executor_kills.ExecutorKill` as JSON) kills them from the commit hooks
of the partitions being written (markers under ``WORKDIR/executor-kills``), and every
sink's start is noted in ``WORKDIR/writing.txt`` for a killer outside. ``--append`` adds a
PostgreSQL sink in append mode (``pglog``). ``--noidem`` adds a sink with no
idempotency of its own, recording every write it gets (:mod:`tests.chaos.noidem`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.*

from fanout import FanOut
from fanout.spark import JVM_GC, local_session
from tests.chaos.executor_kills import ExecutorKill, ExecutorKiller, WritingNotes
from tests.chaos.killer import ChaosKiller, KillPlan
from tests.chaos.lag_input import LAG_SCHEMA
from tests.chaos.noidem import NAME as NOIDEM
from tests.chaos.noidem import RECORD, AppendOnlySink
from tests.integration.streams import SCHEMA, run_stream

REPO = Path(__file__).resolve().parents[2]
PIPELINE = "chaos"
PG_TABLE = "chaos_orders"
TOPIC = "chaos-orders"
SINKS = ("lake", "pg", "bus")
APPEND_SINK, APPEND_TABLE = "pglog", "chaos_orders_log"


def sinks(
    workdir: Path,
    pg_url: str,
    bootstrap: str,
    lag: bool = False,
    append: bool = False,
    lake_from: str = "driver",
) -> list[dict[str, object]]:
    """Delta (append, written from ``lake_from``), PostgreSQL (upsert; lagging alone with
    ``lag``) and Kafka (transactional); with ``append``, PostgreSQL in append mode too."""
    # the lag input updates keys batch after batch, and a micro-batch may hold two input
    # files: the newer version (amount = the file's number) wins within a batch
    policy = {"on_failure": "lag", "retries": 0, "order_by": "amount"} if lag else {}
    configs: list[dict[str, object]] = [
        {"type": "delta", "name": "lake", "path": str(workdir / "lake"),
         "write_from": lake_from},
        {"type": "postgres", "name": "pg", "url": pg_url, "table": PG_TABLE,
         "keys": ["order_id"], "create_table": True, "partitions": 4, **policy},
        {"type": "kafka", "name": "bus", "bootstrap_servers": bootstrap, "topic": TOPIC,
         "key": "order_id", "partitions": 4},
    ]  # fmt: skip
    if append:
        configs.append({"type": "postgres", "name": APPEND_SINK, "url": pg_url,
                        "table": APPEND_TABLE, "mode": "append", "create_table": True,
                        "partitions": 4})  # fmt: skip
    return configs


def executor_jvm_options() -> dict[str, str]:
    """The executors' JVM options: the driver's (fanout.spark.JVM_GC) and those the tests
    give every driver they start (``SPARK_SUBMIT_OPTS``, conftest.SHORT_LIVED_JVM: no
    optimizing JIT, cheaper on small data), which executor JVMs do not inherit."""
    extra = os.environ.get("SPARK_SUBMIT_OPTS", "").strip()
    return {"spark.executor.extraJavaOptions": f"{JVM_GC} {extra}".strip()}


def main() -> None:
    """Run the stream to the end of its input, unless the chaos plugin kills us first."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("pg_url")
    parser.add_argument("bootstrap")
    parser.add_argument("--kill", help="a KillPlan as JSON")
    parser.add_argument("--lag", action="store_true", help="the PostgreSQL sink lags alone")
    parser.add_argument("--master", default="local[2]", help="e.g. local-cluster[2,1,1024]")
    parser.add_argument("--append", action="store_true", help="a PostgreSQL append sink too")
    parser.add_argument("--executor-kills", help="a list of ExecutorKill as JSON")
    parser.add_argument("--noidem", action="store_true", help="a sink that never skips too")
    args = parser.parse_args()
    plugins: list[object] = [ChaosKiller(KillPlan(**json.loads(args.kill)))] if args.kill else []
    if args.master.startswith("local-cluster"):
        # executors inherit this environment: they import tests.chaos.executor_kills
        paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        state = args.workdir / "executor-kills"
        state.mkdir(parents=True, exist_ok=True)
        kills = [ExecutorKill(**k) for k in json.loads(args.executor_kills or "[]")]
        plugins += [
            ExecutorKiller(kills, str(state)),
            WritingNotes(str(args.workdir / "writing.txt")),
        ]
    conf = {"spark.sql.shuffle.partitions": "4"}
    if args.master.startswith("local-cluster"):
        conf.update(executor_jvm_options())
    spark = local_session("fanout-chaos", master=args.master, conf=conf)
    lags = run_pipeline(
        spark,
        args.workdir,
        args.pg_url,
        args.bootstrap,
        plugins=plugins,
        lag=args.lag,
        append=args.append,
        noidem=args.noidem,
        lake_from="executors" if args.master.startswith("local-cluster") else "driver",
    )
    if lags is not None:
        print("LAGS " + json.dumps(lags), flush=True)
    spark.stop()


def run_pipeline(
    spark: Any,
    workdir: Path,
    pg_url: str,
    bootstrap: str,
    *,
    plugins: list[object] | None = None,
    lag: bool = False,
    append: bool = False,
    noidem: bool = False,
    lake_from: str = "driver",
) -> dict[str, int] | None:
    """One run of the chaos pipeline in ``spark``, to the end of its input: the driver's
    run, and the run a test makes in its own session where no kill is planned (a restart
    on the same checkpoint, ledger and sinks, without a Spark start of its own). With
    ``lag`` the run ends with the catch-up; the batches each sink still lags by. With
    ``noidem`` an :class:`~tests.chaos.noidem.AppendOnlySink` too, recording to
    ``workdir/noidem.jsonl``."""
    configs: list[dict[str, object] | AppendOnlySink] = [
        *sinks(workdir, pg_url, bootstrap, lag, append, lake_from)
    ]
    if noidem:
        configs.append(
            AppendOnlySink(NOIDEM, path=str(workdir / RECORD), ledger=str(workdir / "ledger"))
        )
    fan = FanOut(
        PIPELINE,
        str(workdir / "ledger"),
        configs,
        plugins=plugins or [],
        backoff_s=0.2,
        spool=str(workdir / "spool") if lag else None,
        probe_interval_s=0.3,
        # the sinks share their tasks (the default): an executor killed for one sink's
        # partition also kills the other sinks' writers in that task
    )
    try:
        run_stream(
            spark, workdir / "input", fan, workdir / "checkpoint", LAG_SCHEMA if lag else SCHEMA
        )
        if not lag:
            return None
        lags = fan.catch_up(timeout_s=120)
        return {name: state.batches for name, state in lags.items()}
    finally:
        fan.close()


if __name__ == "__main__":
    main()
