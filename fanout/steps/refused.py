"""A batch fanout refused before any sink wrote it, recorded as the refusal leaves
``FanOut.__call__`` (:mod:`fanout.ledger.refusals`; docs/architecture.md §4, "Refused
batches").

Spark replays such a batch at the next start with its original planning time, and a
replay whose sink can no longer tell whether it holds the batch is refused (its first
attempt may have written it). A batch fanout refused before any write (``fanout run``'s
clean stop at the stop gate, a closed ``FanOut``, a lost target or a renamed sink at the
run's first batch...) was written by nobody: its row lets the replay pass. One row, only when
both hold (else none: the cost of a missing row is a possible false refusal, which is
safe; a wrong row could let a batch be written twice):

- no sink write of the attempt began: it left before the steps that write
  (:meth:`PreWrite.writing`, called by the dispatcher right before them), and not from the
  guard step (:meth:`PreWrite.admitting`: a replaced or rolled-back checkpoint is refused
  again at its replay, a refused reset's batch is admitted into a new epoch, where no sink
  has a mark and the replay check asks nothing; a refused reset leaves the ledger as it
  was);
- the attempt is certainly the batch's first, not a replay (:meth:`PreWrite.first_attempt`):
  Spark planned it after this ``FanOut`` was born, and no attempt of that batch id raised
  earlier in this process. A replay's earlier attempt may have written; a row of the
  replay's refusal would let the next replay pass behind it.

Nothing of this runs on a batch that passes: a flag set, no read, no write.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Literal

from fanout.contract.batch import BatchInfo
from fanout.ledger.entry import Ledger, ledger_key
from fanout.ledger.refusals import record_refused
from fanout.observe.logs import batch_fields
from fanout.steps.context import (
    ContextReader,
    checkpoint_root,
    parse_offset_log,
    query_id_of,
    read_file_directly,
)

log = logging.getLogger("fanout")

Phase = Literal["entered", "admitting", "admitted", "writing"]
"""Where the batch in ``FanOut.__call__`` is: before the guard step, in it, past it, at
the steps that may write."""

RECORDED: tuple[Phase, ...] = ("entered", "admitted")
"""The phases whose refusal is recorded."""

_raised: dict[tuple[str, str], set[int]] = {}
"""Per (ledger location, pipeline), the batch ids of attempts that raised in this process,
by any ``FanOut``: a later attempt of one of them is a replay (Spark replays a batch that
raised), whoever runs it."""
_raised_here: weakref.WeakKeyDictionary[object, dict[str, set[int]]] = weakref.WeakKeyDictionary()
"""The same for a ledger without a location (in memory), per ledger object: a new one
never finds another's (gone, its ``id()`` reused)."""
_raised_lock = threading.Lock()


class PreWrite:
    """What one ``FanOut`` knows to record a batch it refused before any write.

    :param ledger: the pipeline's ledger.
    :param pipeline: the pipeline's name.
    :param born_ms: when the ``FanOut``'s run memory was born (epoch ms,
        :class:`fanout.steps.replay.RunMemory`): its ``__init__``, or under Spark Connect
        its ``__setstate__``, which the server's worker runs before the run plans its first
        batch (the ``FanOut`` is built later, at that batch). A batch planned at or after it
        was planned by a run of this process, whose every attempt this process saw; also
        for a ``FanOut`` built inside a foreachBatch call, whose run memory then forgets
        its birth (its first batch was planned before it). ``None``: no batch is certainly
        a first attempt.
    """

    def __init__(self, ledger: Ledger, pipeline: str, born_ms: int | None) -> None:
        self.ledger = ledger
        self.pipeline = pipeline
        self.born_ms = born_ms
        self._phase: Phase = "entered"
        self._epoch: int | None = None  # the epoch the guard admitted the batch into

    def entering(self) -> None:
        """A batch enters ``FanOut.__call__``: nothing of it done yet."""
        self._phase, self._epoch = "entered", None

    def admitting(self) -> None:
        """The guard step begins (:mod:`fanout.steps.admit`): a refusal from it is not
        recorded (a replaced or rolled-back checkpoint, refused again at its replay; a
        reset's start refused, whose replay a new epoch admits, with no marks there)."""
        self._phase = "admitting"

    def admitted(self, epoch: int) -> None:
        """The guard admitted the batch into ``epoch``: a refusal recorded from here on
        is of that epoch."""
        self._phase, self._epoch = "admitted", epoch

    def writing(self) -> None:
        """The batch reaches the steps that may write to a sink (persist, routes, spool,
        write): from here on its refusal is recorded no more."""
        self._phase = "writing"

    def first_attempt(self, info: BatchInfo) -> bool:
        """Whether ``info`` is certainly its batch's first attempt: Spark planned it
        (``batch_timestamp_ms``) at or after :attr:`born_ms`, and no attempt of its batch
        id raised before in this process. ``False`` when the planning time or the birth is
        unknown. Asked as the attempt enters, before it raises, and at step 3c (a refusal
        row is read only when this is ``False``)."""
        planned = info.batch_timestamp_ms
        if planned is None or self.born_ms is None or planned < self.born_ms:
            return False
        with _raised_lock:
            return info.batch_id not in self._raised()

    def _raised(self) -> set[int]:
        """This pipeline's batches that raised in this process (caller holds the lock)."""
        if getattr(self.ledger, "path", None) is None:
            try:
                return _raised_here.setdefault(self.ledger, {}).setdefault(self.pipeline, set())
            except TypeError:  # a ledger object that cannot be weakly referenced or hashed
                pass
        return _raised.setdefault((ledger_key(self.ledger), self.pipeline), set())

    def context(self, reader: ContextReader, batch_df: Any, batch_id: int) -> BatchInfo | None:
        """The context of a batch refused before fanout read it (the stop gate, a closed
        ``FanOut``): its planning time, from ``offsets/<batch_id>`` in the checkpoint the
        reader knows (else the batch's query's, asked of Spark), read with pyarrow
        (:func:`fanout.steps.context.read_file_directly`), never through Hadoop: at a stop,
        Spark may have interrupted the batch's thread, and a read through Hadoop from it
        finds the file empty. ``None`` when it cannot be read (no row then)."""
        try:
            location = reader.known_location()
            if location is None and (query_id := query_id_of(batch_df)) is not None:
                location = checkpoint_root(query_id)
            text = None if location is None else read_file_directly(location, f"offsets/{batch_id}")
            planned = None if text is None else parse_offset_log(text)
        except Exception as exc:
            log.debug("pipeline %s, batch %s: offsets unreadable at its refusal: %s",
                      self.pipeline, batch_id, exc)  # fmt: skip
            return None
        if planned is None:
            return None
        return BatchInfo(self.pipeline, int(batch_id), None, planned.source_offsets,
                         batch_timestamp_ms=planned.batch_timestamp_ms)  # fmt: skip

    def left(
        self, batch_id: int, info: BatchInfo | None, first: bool, error: BaseException
    ) -> None:
        """The attempt of ``batch_id`` leaves ``FanOut.__call__`` with ``error``; ``first``:
        :meth:`first_attempt`'s answer as it entered. Records the refusal when it came
        before the guard step (the ledger's current epoch, which a replay is admitted
        into) or after it and before any write (the epoch admitted), the attempt was the
        batch's first and ``error`` is an ``Exception`` (not an interrupt). A failing
        record is logged, never raised: the batch's own error goes on (a clean stop stays
        one)."""
        with _raised_lock:
            self._raised().add(int(batch_id))
        planned = None if info is None else info.batch_timestamp_ms
        if self._phase not in RECORDED or not first or planned is None:
            return
        if not isinstance(error, Exception):
            return
        fields = batch_fields(self.pipeline, batch_id)
        try:
            epoch = self._epoch
            if epoch is None:  # before the guard: the epoch a replay is admitted into
                epoch = self.ledger.lookup(self.pipeline, ()).epoch
            record_refused(self.ledger, self.pipeline, epoch, int(batch_id), planned)
        except Exception as exc:
            log.warning(
                "pipeline %s, batch %s: refused before any sink wrote it, but the ledger "
                "could not record so (%s: %s); if a sink's own records of its batches expire "
                "before Spark replays it, the replay may be refused as possibly written: "
                "then `--accept-lost-target <sink>` lets it write",
                self.pipeline, batch_id, type(exc).__name__, exc, extra=fields,
            )  # fmt: skip
            return
        log.info(
            "pipeline %s, batch %s: refused before any sink wrote it (%s); recorded in the "
            "ledger, so its replay is known unwritten",
            self.pipeline, batch_id, type(error).__name__, extra=fields,
        )  # fmt: skip
