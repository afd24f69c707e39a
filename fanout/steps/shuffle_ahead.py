"""A shared job's shuffle, started before the job (docs/architecture.md §3.4).

A shared job reads the batch hashed into its members' partitions: a stage of tasks
scanning the batch and writing a shuffle, then one task per partition. Spark starts that
first stage only when the job is submitted, after the members prepared and the job was
planned: ~40-70 ms of a batch with no task running. The shuffle's input (the batch selected,
hashed and sorted as the group's last layout says) is known sooner, so
:func:`start_shuffle` submits its map stage at once (as the batch arrives, or while the
members prepare: :mod:`fanout.steps.shared_frame`), and gives a DataFrame reading that
stage's output: the job built on it runs only the second stage (or waits for the first,
which Spark shares between the two jobs). Writing a shuffle has
no effect outside Spark, so a stage started for nothing is cancelled and nothing else.

Spark's own ``foreachBatch`` hands the batch to its function the same way, as a DataFrame
over the streaming query's physical plan (``LogicalRDD.fromDataset``). This uses three
methods that are public in the JVM but not in Spark's API (``QueryExecution.toRdd``,
``SparkContext.submitMapStage``, ``SparkSession.internalCreateDataFrame``), so any failure
falls back to the job planning the shuffle itself. Classic sessions only: under Spark
Connect there is no JVM here, and nothing happens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fanout.contract.sessions import ADAPTIVE, is_classic, session_settings

log = logging.getLogger("fanout")

_SHUFFLE_EXCHANGE = "org.apache.spark.sql.execution.exchange.ShuffleExchangeExec"
_MAX_STEPS = 8  # plan nodes between a frame's result and its own shuffle: a handful


@dataclass(frozen=True)
class StartedShuffle:
    """A shuffle whose map stage is running (or done).

    :param frame: a DataFrame with the planned frame's rows, read from that shuffle.
    """

    frame: Any
    _stage: Any

    def cancel(self) -> None:
        """Stop the map stage when no job will read it (a job that reads it keeps it)."""
        try:
            self._stage.cancel()
        except Exception as exc:  # the session is stopping: nothing left to cancel
            log.debug("the started shuffle could not be cancelled: %s", exc)


def start_shuffle(df: Any) -> StartedShuffle | None:
    """Plan ``df`` (without adaptive execution, as its job would be), start the map stage of
    the shuffle it ends with, and return a frame reading it; ``None`` when ``df`` is not a
    classic DataFrame, does not end in a shuffle of its own, or Spark refuses (an empty
    batch: no partitions).

    Only ``df``'s own ``repartition``, followed by at most a sort within partitions and
    projections, is started: that shuffle is new with this plan, so no other job can have
    made its stage. A shuffle in the batch's own lineage (below the batch's scan) may belong
    to a job running now, and Spark's scheduler fails, stopping the SparkContext, when a map
    stage is submitted for a stage another job made."""
    if not is_classic(df):
        return None
    stage = None
    try:
        spark = df.sparkSession
        execution = df._jdf.queryExecution()
        with session_settings(spark.conf, {ADAPTIVE: "false"}):
            exchange = _own_exchange(execution.executedPlan())
            if exchange is None:
                return None
            # in this thread: the stage's job carries its job group, like the job's own;
            # submitted first, the map stage runs while the rest of the plan is made
            stage = spark.sparkContext._jsc.sc().submitMapStage(exchange.shuffleDependency())
            rdd = execution.toRdd()  # reads the exchange's shuffle: the same dependency
        return StartedShuffle(_frame_over(spark, rdd, df._jdf.schema()), stage)
    except Exception as exc:
        if stage is not None:  # no frame reads it
            StartedShuffle(None, stage).cancel()
        log.debug("the shared job's shuffle could not be started early: %s", exc)
        return None


def _own_exchange(plan: Any) -> Any:
    """The shuffle exchange reached from ``plan``'s root through nodes of one child each (a
    sort, a projection, Spark's code-generation wrappers), ``None`` when the plan forks or
    ends (the batch's scan) first."""
    node = plan
    for _ in range(_MAX_STEPS):
        if node.getClass().getName() == _SHUFFLE_EXCHANGE:
            return node
        children = node.children()
        if children.size() != 1:
            return None
        node = children.apply(0)
    return None


def _frame_over(spark: Any, rdd: Any, schema: Any) -> Any:
    from pyspark.sql import DataFrame

    return DataFrame(spark._jsparkSession.internalCreateDataFrame(rdd, schema, False), spark)
