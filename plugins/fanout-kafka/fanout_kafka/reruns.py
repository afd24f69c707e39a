"""A partition's task run again within one attempt of a batch, on a broker that holds a
committed transaction's markers back while a transaction sharing one of its partitions is
open: the Tansu broker (:mod:`fanout_kafka.abandoned`).

Spark runs a task again when its executor is lost (a task retry, or a stage retry after
the shuffle it read was lost with the executor) and, under speculation, runs a copy
beside it. The driver ends the transactions killed tasks left open before an attempt
reads the markers (:func:`fanout_kafka.abandoned.end_abandoned_transactions`), but
nothing runs on the driver between two runs of one task: when the first run committed
beside a transaction a killed task left open, the second finds its marker held back
(committed, not yet applied) and, reading "not written", wrote the partition a second
time (``tests/chaos/test_executor_kills.py``: 84 records, one partition of one batch, twice).
A task cannot end the other partitions' transactions itself: they may be live tasks of
the same attempt.

So on such a broker each run notes, just before it commits, that the partition commits in
this attempt of the batch (a file per transactional id beside the ends' lock file,
:mod:`fanout_kafka.turns`, holding the attempt's token, which the driver draws for each
attempt). A run whose marker does not hold the batch reads the note after its
``init_transactions``, which fenced every earlier run: if an earlier run of this attempt
got as far as committing, its commit may have gone through (a run fenced before it could
commit never wrote the note), so the marker cannot tell, and the run fails as transient
without writing: the batch's replay ends the open transactions on the driver, reads the
markers and skips the partition if it holds the batch. A run killed before its commit
leaves no note, so its retry writes as before. The note is a local file, a few bytes
before each commit, on Tansu only (the embedded broker runs on the executors' machine, as
the ends' lock file assumes); on Kafka nothing is written or read.
"""

from __future__ import annotations

import hashlib
import os
import uuid

from fanout.errors import TransientSinkError


def new_attempt() -> str:
    """A token for one attempt of a batch (drawn on the driver, given to its tasks)."""
    return uuid.uuid4().hex


def note_path(end_turns: str | None, transactional_id: str) -> str | None:
    """The note file of ``transactional_id``, beside the ends' lock file ``end_turns``
    (``None`` when the broker needs no turns, and so no notes)."""
    if end_turns is None:
        return None
    digest = hashlib.sha256(transactional_id.encode()).hexdigest()[:16]
    return f"{end_turns.removesuffix('.lock')}-{digest}.commit"


def note_committing(path: str | None, attempt: str) -> None:
    """Note that a run of attempt ``attempt`` is about to commit (nothing without a path
    or a token)."""
    if path is None or not attempt:
        return
    staged = f"{path}.{os.getpid()}"
    with open(staged, "w") as note:
        note.write(attempt)
    os.replace(staged, path)


def committing_in(path: str | None, attempt: str) -> bool:
    """Whether a run of attempt ``attempt`` noted that it was about to commit."""
    if path is None or not attempt:
        return False
    try:
        with open(path) as note:
            return note.read() == attempt
    except FileNotFoundError:
        return False


class MarkerHeldBack(TransientSinkError):
    """An earlier run of this partition's task in this attempt of the batch got as far as
    committing, and the marker, which the broker may hold back, does not hold the batch:
    not written again; transient (the batch's replay settles the markers and decides)."""


__all__ = ["MarkerHeldBack", "committing_in", "new_attempt", "note_committing", "note_path"]
