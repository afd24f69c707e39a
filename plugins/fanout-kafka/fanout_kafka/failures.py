"""How the Kafka sink tells failures apart: retriable, abortable, fenced or fatal, bad
records. Used on the executors by :mod:`fanout_kafka.transaction`, and on the driver for a
batch's one error from its partitions' (:func:`batch_failure`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException

from fanout.errors import SinkError, SinkWriteError, TransientSinkError
from fanout_kafka.errors import KafkaAbortedError, KafkaBadRecordError, KafkaFencedError
from fanout_kafka.records import BadRecord
from fanout_kafka.reruns import MarkerHeldBack

if TYPE_CHECKING:
    from fanout.partitioned.outcome import PartitionOutcome

FENCED_CODES = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
"""Error codes meaning a newer producer with the same transactional id took over."""

REJECTED_RECORD_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_MSG,
        KafkaError.POLICY_VIOLATION,
    }
)
"""Delivery errors about one record itself, not the broker or the transaction."""


class Rejected(Exception):
    """Records the broker (or the local producer) refused, with the refusal."""

    def __init__(self, rejected: list[BadRecord]) -> None:
        super().__init__(f"{len(rejected)} record(s) refused")
        self.rejected = rejected


class LettersNotParked(TransientSinkError):
    """A partition committed, but its dead letters could not be written to the target yet:
    transient (the replay skips the partition and parks them from its journal,
    :mod:`fanout_kafka.journal`)."""


class TransactionTooLong(Exception):
    """A partition's transaction ran longer than ``transaction.timeout.ms``: the broker's
    coordinator aborts such a transaction and bumps the producer epoch, so the commit
    fails with what looks like fencing. Deterministic for a partition of this size, so a
    replay would repeat it: not transient."""

    def __init__(self, elapsed_s: float, timeout_ms: int, records: int) -> None:
        super().__init__(f"transaction ran {elapsed_s:.1f} s, over {timeout_ms} ms")
        self.elapsed_s, self.timeout_ms, self.records = elapsed_s, timeout_ms, records


def is_retriable(err: KafkaError) -> bool:
    """Retry in the task: retriable, and neither fatal nor requiring an abort."""
    return bool(err.retriable() and not err.fatal() and not err.txn_requires_abort())


def classify(exc: BaseException) -> tuple[str, bool]:
    """The kind of a partition failure and whether replaying the batch may help.

    ``timeout`` (the transaction outlived ``transaction.timeout.ms``: the broker aborted
    it), ``fenced`` (another writer owns the transactional id), ``fatal`` (the producer is
    unusable), ``abortable`` (the transaction was aborted: replay), ``retriable`` (retries
    in the task exhausted: replay), ``bad_record``, ``aborted`` (a
    :class:`fanout.TransientSinkError` from a hook: replay) or ``error``.
    """
    if isinstance(exc, Rejected):
        return "bad_record", False
    if isinstance(exc, TransactionTooLong):
        return "timeout", False
    if isinstance(exc, TransientSinkError):
        return "aborted", True
    err = kafka_error(exc)
    if err is not None:
        if err.code() in FENCED_CODES:
            return "fenced", False
        if err.fatal():
            return "fatal", False
        if err.txn_requires_abort():
            return "abortable", True
        if err.retriable():
            return "retriable", True
        return "error", False
    return "error", False


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError of ``exc`` or of the first KafkaException in its chain
    (confluent-kafka raises ``SystemError`` from a callback run while a fatal error is
    pending, chained to that error)."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KafkaException) and current.args:
            if isinstance(current.args[0], KafkaError):
                return current.args[0]
        current = current.__cause__ or current.__context__
    return None


def is_kafka_fatal(exc: BaseException) -> bool:
    """Whether ``exc`` carries a fatal or fenced Kafka error."""
    err = kafka_error(exc)
    return err is not None and (bool(err.fatal()) or err.code() in FENCED_CODES)


def text(exc: BaseException) -> str:
    """A short description of ``exc`` (its Kafka error name and text when it has one)."""
    err = kafka_error(exc)
    if err is not None:
        return f"{err.name()}: {err.str()}"
    return f"{type(exc).__name__}: {exc}"


def describe(
    exc: BaseException, kind: str | None, partition: int, transactional_id: str, topic: str
) -> str:
    """A partition's failure for people: where, what happened, and what to change."""
    where = f"partition {partition} (transactional.id {transactional_id!r}, topic {topic!r})"
    if kind == "fenced":
        return (
            f"{where}: fenced: another writer took over transactional id "
            f"{transactional_id!r} (a newer attempt of this partition, a task of the query "
            f"a checkpoint reset replaced, still running, or another pipeline using the "
            f"same transactional_id_prefix); this attempt's "
            f"transaction is aborted and none of it is visible ({text(exc)})"
        )
    if isinstance(exc, TransactionTooLong):
        return (
            f"{where}: its transaction of {exc.records} record(s) ran {exc.elapsed_s:.1f} s, "
            f"longer than transaction_timeout_ms={exc.timeout_ms}: the broker aborts such "
            "a transaction (its producer then looks fenced), and a replay would repeat "
            "it. Raise the sink's `transaction_timeout_ms` (at most the broker's "
            "transaction.max.timeout.ms) or its `partitions` (fewer records per "
            "transaction); nothing of this attempt is visible"
        )
    if isinstance(exc, Rejected):
        reasons = "; ".join(b.reason for b in exc.rejected[:3])
        more = f" (and {len(exc.rejected) - 3} more)" if len(exc.rejected) > 3 else ""
        return (
            f"{where}: {len(exc.rejected)} record(s) the topic cannot take and no "
            f"'dead_letter' target: {reasons}{more}"
        )
    if isinstance(exc, LettersNotParked):
        return f"{where}: {text(exc)}"
    if isinstance(exc, MarkerHeldBack):
        return str(exc)  # names the partition, its id and what the replay does
    action = (
        "transaction aborted; the batch will be replayed"
        if kind in ("abortable", "retriable", "aborted")
        else "transaction aborted"
    )
    return f"{where}: {action}: {text(exc)}"


_FAILURE_ORDER = (
    "fenced",
    "timeout",
    "fatal",
    "bad_record",
    "error",
    "abortable",
    "retriable",
    "aborted",
)
"""The partitions' failure kinds, worst first: the worst names the batch's error."""


def batch_failure(
    sink: str,
    batch_id: int,
    failed: Sequence[PartitionOutcome],
    outcomes: Sequence[PartitionOutcome],
) -> SinkError:
    """The driver's one error for a batch whose partitions ``failed`` (of ``outcomes``),
    naming every failed partition's cause; its class by the worst kind: fenced, then bad
    record, then aborted (transient) when all are transient."""
    done = [o.partition for o in outcomes if o.status in ("committed", "skipped")]
    lines = [
        f"{len(failed)} of {len(outcomes)} partition(s) failed; partitions holding the "
        f"batch (skipped on replay): {done or 'none'}"
    ]
    lines += [f"  - {o.failure.message}" for o in failed if o.failure is not None]
    message = "\n".join(lines)
    kinds = {o.failure.kind for o in failed if o.failure is not None}
    worst = next((k for k in _FAILURE_ORDER if k in kinds), "error")
    error_class: type[SinkError] = SinkWriteError
    if worst == "fenced":
        error_class = KafkaFencedError
    elif worst == "bad_record":
        error_class = KafkaBadRecordError
    elif all(o.failure is not None and o.failure.transient for o in failed):
        error_class = KafkaAbortedError
    return error_class(message, sink=sink, batch_id=batch_id)
