"""A shared job's ``mapInArrow`` built once per layout, its batch's task sent beside it.

pyspark's ``DataFrame.mapInArrow`` pickles the function into a new Python UDF for every
call: 38 py4j round trips for a shared job of eight columns (~5 ms on a quiet driver).
They run while the batch's scan runs (its shuffle is started ahead), and on two busy cores
each round trip waits for a core and takes it from the scan's tasks. Building the whole job
after the scan instead made the scan's longer task 110-120 ms against 140-180; building
the UDF once, as here, 148-157 (bench/README.md, session 38).

So the UDF is made once for a layout's columns, over unresolved columns, with a function
that holds no batch: :class:`TaskFromProperty`. The batch's :class:`SharedPartitionTask`
(pickled, ~10 KB) travels as a Spark local property of the thread that starts the job,
which Spark hands to every task of that job, and pyspark to its Python worker. Each batch
then costs one round trip to apply the UDF to its frame and two to set and clear the
property.

Spark also writes a job's local properties into its listener events (the event log, the
history server, any listener a user adds), unredacted, and the task holds the writers'
settings, passwords included. So the property holds the task sealed (Fernet: AES and an
HMAC, from the ``cryptography`` package) with a key drawn once per driver process, which
travels only inside the UDF's function, in the task binary Spark ships to its executors.

Classic sessions only (Spark Connect has no local properties; it builds the job as
before).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fanout.contract.sessions import own_local_properties

if TYPE_CHECKING:
    import pyarrow as pa

PROPERTY = "fanout.shared.task"
"""The local property holding the running shared job's task, pickled and sealed."""


def _new_key() -> bytes:
    from cryptography.fernet import Fernet

    return Fernet.generate_key()


SEALING_KEY = _new_key()
"""This driver process's key for the tasks it sends in :data:`PROPERTY`."""


@dataclass(frozen=True)
class TaskFromProperty:
    """The function of a cached shared UDF: runs the task the job's local property holds,
    opened with ``key`` (the driver's :data:`SEALING_KEY`, shipped with the function)."""

    key: bytes = field(repr=False)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Load this job's task from :data:`PROPERTY` and run it on the partition."""
        from pyspark import TaskContext

        context = TaskContext.get()
        text = context.getLocalProperty(PROPERTY) if context is not None else None
        if not text:
            raise RuntimeError(
                f"fanout's shared task found no {PROPERTY!r} local property: the job was "
                "started from a thread that did not set it"
            )
        yield from decode(text, self.key)(batches)


def encode(task: Any, key: bytes = SEALING_KEY) -> str:
    """``task`` as the text of :data:`PROPERTY`: pickled, then sealed with ``key``."""
    from cryptography.fernet import Fernet
    from pyspark import cloudpickle

    return Fernet(key).encrypt(cloudpickle.dumps(task)).decode("ascii")


def decode(text: str, key: bytes) -> Any:
    """The task :func:`encode` sealed with ``key``."""
    import pickle

    from cryptography.fernet import Fernet

    return pickle.loads(Fernet(key).decrypt(text.encode("ascii")))


class SharedUdfs:
    """The shared UDF column of each layout (its frame's columns), kept for the session's
    life; thread-safe. Made again when the Python files or the environment the UDF ships
    with changed (``SparkContext.addPyFile``, as pyspark's own UDF would see them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per SparkContext (the UDF holds its accumulator), kept with it so its id stays its,
        # and per the Python files and environment the UDF ships (captured when it is made)
        self._columns: dict[tuple[Any, ...], tuple[Any, Any]] = {}

    def map(self, frame: Any, columns: Sequence[str], schema: Any) -> Any:
        """``frame`` mapped by the shared UDF, ``frame`` holding ``columns`` in that order
        and the result ``schema``: a DataFrame whose job must be started inside
        :func:`carrying` the batch's task."""
        from pyspark.sql import DataFrame

        session = frame.sparkSession
        context = session.sparkContext
        jsc = context._jsc
        key = (
            id(jsc),
            tuple(columns),
            tuple(getattr(context, "_python_includes", None) or ()),
            tuple(sorted((getattr(context, "environment", None) or {}).items())),
        )
        with self._lock:
            kept = self._columns.get(key)
        if kept is None:
            kept = (jsc, _udf_column(columns, schema))
            with self._lock:
                self._columns[key] = kept
        return DataFrame(frame._jdf.mapInArrow(kept[1], False, None), session)


SHARED_UDFS = SharedUdfs()
"""This process's shared UDFs."""


def _udf_column(columns: Sequence[str], schema: Any) -> Any:
    from pyspark.sql import functions
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    from fanout.partitioned.membership import quoted

    udf = pandas_udf(  # type: ignore[call-overload]
        TaskFromProperty(SEALING_KEY),
        returnType=schema,
        functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF,
    )
    return udf(*[functions.col(quoted(c)) for c in columns])._jc


@contextmanager
def carrying(spark_context: Any, task: Any) -> Iterator[None]:
    """Jobs this thread starts in the block carry ``task`` in :data:`PROPERTY`, and no
    other thread's jobs do: the thread's local properties are first made its own, in case
    it shares them with another (:func:`fanout.contract.sessions.spark_threads`)."""
    own_local_properties(spark_context)
    spark_context.setLocalProperty(PROPERTY, encode(task))
    try:
        yield
    finally:
        spark_context.setLocalProperty(PROPERTY, None)
