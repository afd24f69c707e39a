"""The first write's refusal of a batch a vanished writer committed: a sink of the pipeline
the pipeline no longer configures (renamed or removed after it committed its very first
batch and before that batch's ledger mark) whose records of the batch are at the end of
the topic and whose markers hold it (:mod:`fanout_kafka.renamed`, docs/architecture.md
§8.3, "A sink renamed mid-batch").

:class:`TailCheck` is given what the check needs of the sink (its name, topic,
``open_timeout_s``, secrets, and its markers' answer for another name); the sink asks it
once per ``open()``, at its first write in a scope
(:meth:`fanout_kafka.sink.KafkaSink._refuse_vanished_writer`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.contract.sink import PartlyHeld
from fanout.errors import SinkError, SinkWriteError, TransientSinkError
from fanout.observe.secrets import redact
from fanout_kafka.driver_admins import ADMINS

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings

log = logging.getLogger("fanout_kafka")

MarkersHold = Callable[[dict[str, Any], str, int, int, str, float], "bool | PartlyHeld | None"]
"""What a name's markers say of a batch: ``(config, pipeline, epoch, batch_id, name,
timeout_s)`` (:meth:`fanout_kafka.sink.KafkaSink._markers_hold`)."""


@dataclass(frozen=True)
class TailCheck:
    """The read of the topic's end for a vanished writer's batch, for one sink.

    :param sink: the sink's name.
    :param topic: the sink's topic.
    :param timeout_s: the sink's ``open_timeout_s``: the whole read's time.
    :param secrets: what is masked in the errors said.
    :param markers_hold: a name's markers' answer for a batch (:data:`MarkersHold`): the
        sink's own, which asks the dead-letter journals too and so may create a missing
        topic, as it did when this read was the sink's method.
    """

    sink: str
    topic: str
    timeout_s: float
    secrets: Sequence[str]
    markers_hold: MarkersHold

    def refuse_vanished_writer(
        self,
        config: dict[str, Any],
        settings: WriterSettings,
        batch_id: int,
        configured: Sequence[str],
    ) -> bool:
        """At the sink's first write in its scope (no partition span recorded there yet,
        :func:`fanout_kafka.membership.record_span`), before anything is written: refuse
        batch ``batch_id`` when the topic's end holds records of it (or a later batch) by
        a sink of the pipeline it no longer configures (not among ``configured``, the
        names it does) whose markers in the scope hold it, whole or part: that
        sink renamed to this one (or removed) after it committed the batch and before its
        ledger mark, in its very first batch, so the ledger never named it and the run's
        start check did not ask (:mod:`fanout_kafka.renamed`). A name found whose markers
        do not hold the batch is read past (the read again without it). A read error
        worth trying again (:func:`fanout_kafka.renamed.read_error_is_transient`) is tried
        up to :data:`~fanout_kafka.renamed.READ_ATTEMPTS` times, then refused
        (:class:`fanout.TransientSinkError`); any other refuses at once
        (:class:`fanout.SinkWriteError`): the batch is not written blindly. Cannot tell, a
        warning and the batch written: the read not ended within ``open_timeout_s`` (a
        topic whose other writers wrote more since the batch's planning than can be read
        in that time), or refused its rights
        (:func:`fanout_kafka.renamed.read_error_is_unauthorized`: a sink with
        producer-only rights on its topic, which it needs nowhere else; refusing would
        stop every run's first batch). Whether the read ended (``False``: cannot tell,
        warned): the sink does not ask again in this ``open()`` once it did."""
        from fanout_kafka.renamed import renamed_refusal

        info, topic = settings.info, self.topic
        pipeline, epoch = settings.pipeline, 0 if info is None else info.epoch
        since_ms = None if info is None else info.batch_timestamp_ms
        exclude = {*configured, self.sink}
        started = time.monotonic()
        deadline = started + self.timeout_s  # the whole read's: rounds, tries, markers
        spent = ""  # what used part of the deadline before a read again: refused if cut short
        while True:
            writers, held, unread = self.read_tail(config, topic, pipeline, epoch, batch_id,
                                                   exclude, since_ms, deadline,
                                                   spent=spent)  # fmt: skip
            if writers is None:
                log.warning(
                    "sink %r, batch %d: cannot tell whether topic %r holds this batch written "
                    "by a sink the pipeline no longer configures (its first write in the "
                    "epoch; %s). If this sink is another renamed after it committed the batch "
                    "and before its ledger mark, the batch is written again",
                    self.sink, batch_id, topic, unread,
                )  # fmt: skip
                return False
            for other, answer in held.items():
                if answer is True or isinstance(answer, PartlyHeld):
                    part = "" if answer is True else " (part of it: some of its partitions)"
                    raise renamed_refusal(self.sink, other, topic, pipeline, epoch, batch_id,
                                          part)  # fmt: skip
            if not writers:
                break
            # names whose markers do not hold the batch: read again past them, for one
            # buried under their records that does
            exclude |= set(writers)
            spent = (
                f"reading past sink(s) {', '.join(map(repr, sorted(writers)))} first (their "
                f"records at the topic's end, their markers not holding the batch)"
            )
        log.debug("sink %r, batch %d: the topic's end read for a vanished sink's records in "
                  "%.1f ms", self.sink, batch_id, 1000 * (time.monotonic() - started))  # fmt: skip
        return True

    def read_tail(
        self,
        config: dict[str, Any],
        topic: str,
        pipeline: str,
        epoch: int,
        batch_id: int,
        exclude: set[str],
        since_ms: int | None,
        deadline: float,
        *,
        spent: str = "",
    ) -> tuple[dict[str, int] | None, dict[str, bool | PartlyHeld | None], str]:
        """:func:`fanout_kafka.renamed.tail_writers` and, for each name it finds, whether
        that name's markers in the scope hold batch ``batch_id``; a failure tried again,
        up to :data:`~fanout_kafka.renamed.READ_ATTEMPTS` times, when its error may pass.
        Every try, its pauses and the markers' reads end by ``deadline`` (``time.monotonic``:
        the first write's ``open_timeout_s``, for the whole read). Names ``None``: cannot
        tell, and why (the read not ended by ``deadline``, or its rights refused:
        :func:`fanout_kafka.renamed.read_error_is_unauthorized`). But a read not ended by
        ``deadline`` after part of the time went elsewhere (``spent``: a name read past
        before, by the caller; a try that failed, here) is refused, not "cannot tell": a
        read given the whole time may have found the batch (:meth:`cut_short`).

        :raises fanout.TransientSinkError: when it still fails after those attempts, or
            when ``deadline`` passes with it failing, or after ``spent``.
        :raises fanout.SinkWriteError: at once, when its error cannot pass.
        """
        from confluent_kafka import KafkaException

        from fanout_kafka.renamed import (
            READ_ATTEMPTS,
            RETRY_PAUSE_S,
            read_error_is_transient,
            read_error_is_unauthorized,
            tail_writers,
        )

        unread = (
            f"the topic's records since the batch's planning not all read within its "
            f"open_timeout_s={self.timeout_s:g} s: raise it to read them"
        )
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                if spent:
                    raise self.cut_short(batch_id, topic, spent)
                return None, {}, unread
            try:
                writers = tail_writers(
                    ADMINS.client(config), config, topic, pipeline, exclude, batch_id,
                    left, since_ms=since_ms,
                )  # fmt: skip
                if writers is None and spent:
                    raise self.cut_short(batch_id, topic, spent)
                held = {
                    other: self.markers_hold(config, pipeline, epoch, batch_id, other,
                                             max(deadline - time.monotonic(), 0.001))
                    for other in sorted(writers or {})
                }  # fmt: skip
                return writers, held, unread
            except (KafkaException, TimeoutError) as exc:
                error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
                transient = not hasattr(error, "code") or read_error_is_transient(error)
                if not transient and read_error_is_unauthorized(error):
                    said = redact(str(exc), self.secrets)
                    return None, {}, (
                        f"the sink may not read it: {said}; grant the sink's principal READ "
                        f"on the topic (or the group the error names) to have it checked, "
                        f"or rename a sink only once `fanout status` shows its last batch "
                        f"marked"
                    )  # fmt: skip
                pause = RETRY_PAUSE_S * attempt
                if transient and attempt < READ_ATTEMPTS and time.monotonic() + pause < deadline:
                    log.info(
                        "sink %r, batch %d: reading the end of topic %r failed (attempt %d of "
                        "%d), trying again: %s", self.sink, batch_id, topic, attempt,
                        READ_ATTEMPTS, redact(str(exc), self.secrets),
                    )  # fmt: skip
                    time.sleep(pause)
                    spent = f"a try that failed with an error worth trying again ({error})"
                    continue
                raise self.unread_tail(batch_id, topic, exc, transient, attempt) from exc

    def cut_short(self, batch_id: int, topic: str, spent: str) -> TransientSinkError:
        """The refusal of batch ``batch_id``'s first write when the read of the end of
        ``topic`` ran out of ``open_timeout_s`` after part of it went to ``spent``: a read
        given the whole time (before the shared deadline, each got its own) may have found
        the old name's batch, so writing would risk it twice. Transient: a restart reads
        again with the whole time."""
        return TransientSinkError(
            f"cannot write batch {batch_id}, this sink's first write to topic {topic!r} in "
            f"the epoch: the read of the topic's end for its records of a sink the pipeline "
            f"no longer configures (one renamed after it committed the batch and before its "
            f"ledger mark) did not end within its open_timeout_s={self.timeout_s:g} s "
            f"after {redact(spent, self.secrets)}. Not written, so as not to write "
            f"such a batch twice: the run fails; restart it (the read starts again with the "
            f"whole time), or raise the sink's open_timeout_s",
            sink=self.sink, batch_id=batch_id,
        )  # fmt: skip

    def unread_tail(
        self, batch_id: int, topic: str, exc: BaseException, transient: bool, attempts: int
    ) -> SinkError:
        """The refusal of batch ``batch_id``'s first write when the end of ``topic`` (or a
        vanished name's markers) cannot be read: ``transient`` after ``attempts`` tries
        (:class:`fanout.TransientSinkError`: the batch is tried again as any transient
        failure), else at once (:class:`fanout.SinkWriteError`)."""
        said = redact(str(exc), self.secrets)
        why = (
            f"failed {'once' if attempts == 1 else f'{attempts} times'} within its "
            f"open_timeout_s={self.timeout_s:g} s with an error worth trying again "
            f"({said}): the run "
            "fails; restart it once the brokers answer (if they answer and the read used its "
            "time up, a deep topic's, with the sink's open_timeout_s raised)"
            if transient
            else f"failed ({said}), an error trying again does not clear: fix it (the "
            "topic, its partitions, the sink's rights to read it) and restart"
        )
        text = (
            f"cannot write batch {batch_id}, this sink's first write to topic {topic!r} in "
            f"the epoch: the read of the topic's end for its records of a sink the pipeline "
            f"no longer configures (one renamed after it committed the batch and before its "
            f"ledger mark) {why}. Not written, so as not to write such a batch twice"
        )
        if transient:
            return TransientSinkError(text, sink=self.sink, batch_id=batch_id)
        return SinkWriteError(text, sink=self.sink, batch_id=batch_id)


__all__ = ["MarkersHold", "TailCheck"]
