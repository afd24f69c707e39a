"""Spark's Python workers and the cyclic garbage collector.

A reused PySpark worker runs a full ``gc.collect()`` after every task
(``pyspark/daemon.py``). A full collection walks every object the worker holds: pyspark,
pyarrow and pandas, and the sink's driver library once a task imported it. That is about
25 ms of CPU per task on 2 cores, whatever the partition's size (bench/bench_kafka.py:
1.5 µs a record at 25,000 records a partition), and it grows with every library the task
imports. So once per worker, after its first partition, fanout moves the objects alive then
(modules and their caches, mostly) to the collector's permanent generation
(:func:`gc.freeze`): later collections walk only what was created since, about 1.5 ms.

Frozen objects are still freed by reference counting. Only reference cycles among objects
alive at that moment stay until the worker exits: a bounded, one-time cost per worker.

Building a partition's records (a Kafka partition's 25,000 tuples) triggers young
collections that find nothing to free: :func:`collection_paused` holds them off while code
that creates no reference cycles allocates what it keeps.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_frozen = False


def freeze_long_lived_objects() -> bool:
    """Collect, then freeze every object alive, the first time this process calls it;
    returns whether this call froze."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    gc.collect()
    gc.freeze()
    return True


@contextmanager
def collection_paused() -> Iterator[None]:
    """Hold off the cyclic collector while the block runs, when it was enabled; the next
    allocation after the block collects as usual. For blocks that create many lasting
    objects and no reference cycles. The collector is one per process: the first thread to
    leave its block enables it for all, which ends another thread's pause early and costs
    only the saving."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
