"""Ending the transactions a killed task left open, before a replay reads its markers, on a
broker that holds a committed transaction's offsets back while a transaction sharing one
of its partitions is open: the Tansu broker.

Tansu (0.6) ends a transaction in two steps. It writes the commit markers into the
transaction's partitions and answers success; but it applies the transaction's offset
commits -- the sink's partition markers -- only once every transaction whose records
overlap it in a shared partition has ended too, and the last of them to end applies them
all. Two tasks of one batch write the same topic partitions, so this happens all the time,
and a live task's end settles it a moment later. A transaction that never ends, because
its task or driver was killed, holds back the markers of every transaction committed
beside it until its transactional id is initialised again, which aborts it. A replay
that read the markers before that found a committed partition unmarked and wrote it
again: its records twice. Kafka applies the offsets with the commit.

So on such a broker the driver initialises every partition's transactional id, as each
task does for its own, before the first write after ``open()`` and before any attempt
that follows an unfinished one: the transactions left open are aborted, the markers they
held back are applied, and only then are the markers read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Producer

from fanout.errors import TransientSinkError
from fanout.observe.secrets import redact
from fanout_kafka.membership import marked_beyond
from fanout_kafka.options import secret_values
from fanout_kafka.producer_init import init_transactions
from fanout_kafka.turns import turn

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings

log = logging.getLogger("fanout_kafka")


def end_transactions(settings: WriterSettings, ids: Sequence[str]) -> dict[str, Exception]:
    """Initialise each transactional id of ``ids`` (a producer of each, in turn with the
    tasks' ends, :mod:`fanout_kafka.turns`, then closed): any producer of it initialised
    before is fenced and a transaction left open under it aborted. The ids that could not
    be initialised, with the error of each (none: all were).

    Any error of one id (not only the client's :class:`KafkaException`: a ``RuntimeError``,
    ``TypeError`` or ``OSError`` of the client, its settings or the turns' lock file) is
    that id's failure, logged redacted of the producer settings' secrets; the other ids are
    initialised all the same, and each producer made is closed. A ``BaseException`` that
    is not an ``Exception`` (an interrupt) is not caught. The callers fail the batch as
    transient when an id is returned: a transaction left open under it would hold back the
    markers they read next (on Tansu), or the id's producer could still commit."""
    secrets = secret_values(settings.producer)

    def end(transactional_id: str) -> Exception | None:
        try:
            config = settings.producer_config(0)
            config["transactional.id"] = transactional_id
            producer = Producer(config)
        except Exception as exc:
            return _not_ended(settings, transactional_id, exc, secrets)
        try:
            with turn(settings.end_turns):
                init_transactions(producer, settings.operation_timeout_s)
        except Exception as exc:
            return _not_ended(settings, transactional_id, exc, secrets)
        finally:
            _close(producer, settings, transactional_id, secrets)  # no transaction begun
        return None

    if not ids:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(ids), 8)) as pool:
        ended = list(pool.map(end, ids))
    return {i: error for i, error in zip(ids, ended, strict=True) if error is not None}


def _not_ended(
    settings: WriterSettings, transactional_id: str, error: Exception, secrets: Sequence[str]
) -> Exception:
    """Log that ``transactional_id`` could not be initialised (the caller reports the
    brokers' errors in its own words: at debug level; any other type at warning level, as
    the caller names only the first id's error); ``error``."""
    level = logging.DEBUG if isinstance(error, KafkaException) else logging.WARNING
    log.log(level, "sink %r: cannot initialise transactional id %r (to end a transaction "
            "left open under it): %s", settings.sink, transactional_id,
            redact(_text(error), secrets))  # fmt: skip
    return error


def _close(
    producer: Producer, settings: WriterSettings, transactional_id: str, secrets: Sequence[str]
) -> None:
    """Close a producer of :func:`end_transactions`; an error closing it is logged only
    (it began no transaction: its id's initialisation, done or failed, is what counts)."""
    try:
        producer.close()
    except Exception as exc:
        log.warning("sink %r: producer of transactional id %r not closed: %s",
                    settings.sink, transactional_id, redact(_text(exc), secrets))  # fmt: skip


def end_abandoned_transactions(
    settings: WriterSettings,
    partitions: int,
    batch_id: int,
    *,
    extra_ids: Sequence[str] = (),
    why: str = "an earlier attempt left open (to read its partition markers)",
) -> None:
    """Initialise the transactional ids of partitions ``0..partitions-1`` (the driver
    passes the sink's partition span, :func:`fanout_kafka.membership.record_span`: every
    partition it has written a batch of the scope in, so a count lowered since keeps the
    others' ids ended and fenced) and of the partitions beyond them that hold a marker
    (written while the sink had more partitions, before the span was recorded), and
    ``extra_ids``, each in turn with the tasks' ends
    (:func:`end_transactions`): any transaction left open under them is aborted, and the
    markers it held back are applied.

    :raises fanout.TransientSinkError: when an id cannot be initialised.
    """
    try:
        # as the markers' reader looks beyond the count, so does this
        count = partitions + marked_beyond(settings, partitions)
    except Exception as exc:  # not only the client's: the batch fails as transient
        raise _cannot_end(settings, why, exc, batch_id) from exc
    ids = [settings.transactional_id(p) for p in range(count)] + list(extra_ids)
    failed = end_transactions(settings, ids)
    if failed:
        error = next(iter(failed.values()))
        raise _cannot_end(settings, why, error, batch_id) from error


def _cannot_end(
    settings: WriterSettings, why: str, error: BaseException, batch_id: int
) -> TransientSinkError:
    """The refusal of a batch whose transactions ``why`` cannot be ended (the brokers'
    text redacted of the producer settings' secrets)."""
    said = redact(_text(error), secret_values(settings.producer))
    return TransientSinkError(f"cannot end the transactions {why}: {said}",
                              sink=settings.sink, batch_id=batch_id)  # fmt: skip


def _text(error: BaseException) -> str:
    """``error``'s text; prefixed with its type unless it is the client's (whose text
    names the Kafka error), so a bare ``RuntimeError()`` still says what failed."""
    if isinstance(error, KafkaException):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def fence_legacy_transactions(
    settings: WriterSettings,
    legacy_prefix: str,
    partitions: int,
    batch_id: int,
    *,
    fenced_before: bool = False,
) -> None:
    """Initialise the transactional ids of a prefix the sink wrote under before: its
    former default (``fanout-<pipeline>-<sink>``,
    :func:`fanout_kafka.markers.legacy_transactional_id_prefix`), or a recorded prefix
    changed since (:mod:`fanout_kafka.former_ids`): every partition's (as
    :func:`end_abandoned_transactions` counts them) and the route dead letters'
    (``<prefix>#route-0``). A producer of the old version still running is fenced, and a
    transaction it left open is aborted, before the markers are read and before anything
    is written under the new ids, which do not fence the old ones.

    ``fenced_before``: a run of the sink fenced these ids already (the caller knows it
    from the prefix record, written only after such a fence passed). Then the brokers
    refusing the principal *every* one of them (``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``:
    its grant narrowed to the prefix in use since) is warned instead of failing every
    run's first batch: each producer of them was fenced by that run, and none of this
    version has made one since. Without it, or with only some refused, the batch fails
    (tried again at each attempt and each run) until the ids can be fenced: a task still
    alive under them, of another principal, could commit a batch the new ids commit too.

    :raises fanout.TransientSinkError: when an id cannot be initialised.
    """
    legacy = replace(settings, transactional_id_prefix=legacy_prefix)
    why = f"left open under the former transactional ids {legacy_prefix}-<p>"
    try:
        count = partitions + marked_beyond(legacy, partitions)
    except Exception as exc:
        raise _cannot_end(settings, why, exc, batch_id) from exc
    ids = [legacy.transactional_id(p) for p in range(count)] + [f"{legacy_prefix}#route-0"]
    failed = end_transactions(legacy, ids)
    if not failed:
        return
    refused = all(_id_refused(error) for error in failed.values())
    if fenced_before and refused and len(failed) == len(ids):
        log.warning(
            "sink %r: the brokers refuse its principal the former transactional ids %s-<p> "
            "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED for all %d), which an earlier run of "
            "this sink fenced (its recorded prefix is the one in use): not fenced again",
            settings.sink, legacy_prefix, len(ids),
        )  # fmt: skip
        return
    error = next(iter(failed.values()))
    if refused:
        why += (
            f" (the brokers refuse them to the sink's principal: grant it WRITE on the "
            f"transactional ids prefixed {legacy_prefix!r} for one run, which fences them; "
            "the grant may be removed after it)"
        )
    raise _cannot_end(settings, why, error, batch_id) from error


def _id_refused(error: Exception) -> bool:
    """Whether ``error`` is the brokers refusing the principal a transactional id."""
    code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
    return code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


__all__ = ["end_abandoned_transactions", "end_transactions", "fence_legacy_transactions"]
