"""Transaction ends taking turns on a broker that needs it: the Tansu broker.

Tansu (0.6) ends a transaction in three steps that are not atomic: it marks it prepared,
writes its commit markers one partition at a time, then resolves every overlapping
transaction that is prepared. When two transactions sharing a partition end at once, the
second can resolve the first while the first still writes markers; those markers then
reopen the first in Tansu's bookkeeping, and no later transaction on that partition
resolves again. The last stable offset stops, and the consumer-group offsets (the
partition markers) committed in those transactions are never applied, although every
commit returned success. A replay then finds the markers missing and writes the batch
again.

Tansu answers an end only after its three steps, so ends that never overlap cannot race:
on such a broker, the sink's tasks commit and abort one at a time, holding an exclusive
``flock`` on a file named by the broker's address. The embedded broker runs on the
executors' machine, so one file serves every task. Ends are a few milliseconds each.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

TANSU_CLUSTER_ID = "tansu_cluster"
"""The cluster id Tansu reports unless started with another one."""


def needs_turns(cluster_id: str | None) -> bool:
    """Whether transaction ends must take turns on the cluster of this id (Tansu's)."""
    return cluster_id == TANSU_CLUSTER_ID


def turn_file(bootstrap_servers: str) -> str:
    """The lock file of the broker at ``bootstrap_servers`` (chosen on the driver, so
    every task uses the same path whatever its own temporary directory)."""
    digest = hashlib.sha256(bootstrap_servers.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"fanout-kafka-ends-{digest}.lock")


@contextmanager
def turn(path: str | None) -> Iterator[None]:
    """Hold the exclusive lock of ``path`` (nothing when ``None``, or without ``fcntl``).
    The kernel releases it when the holder dies, a killed task included."""
    if path is None:
        yield
        return
    try:
        import fcntl
    except ImportError:  # not POSIX: no turns
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["TANSU_CLUSTER_ID", "needs_turns", "turn", "turn_file"]
