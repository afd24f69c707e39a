"""Committing a scope's marker groups again while runs go on, so the broker keeps them.

The markers are offsets of member-less consumer groups, which a Kafka broker deletes
``offsets.retention.minutes`` (7 days by default) after the group's last commit. A
partition commits its groups only in a transaction that wrote rows, so a pipeline idle
for longer than that lost them, and a crash replay then could not tell which partitions
held its batch. So at the first batch of each ``open()`` in a scope, before the markers
are read, the driver commits every writer's groups again, each to the offset it holds:
the partitions' ``<prefix>-<p>`` (the sink's partition span, and the markers beyond it)
and the route letters' ``<prefix>#route-0``. And again at a later batch of the same
``open()`` once the last renewal in the scope is :func:`renewal_interval_s` old (half the
brokers' ``offsets.retention.minutes``, read at ``open()`` with ``describe_configs``;
hourly when they do not say and are not Tansu, :data:`UNREPORTED_RENEWAL_S`, as the
brokers' retention may be shorter than Kafka's default; Tansu keeps offsets for ever and
is renewed at half Kafka's default): a run whose batches go on for longer than the
retention without rows for some partition (a quiet source, a route sending the sink
nothing) lost those partitions' markers while it ran. Not per batch: one renewal per
half retention. A run with no batch at all for longer than the retention still loses
them: nothing runs to renew them.

Per writer that has a marker: ``init_transactions`` with its own transactional id (a
producer of that id initialised before, a killed run's task still alive, is fenced and its
open transaction aborted), then its groups read (stable: final, now that no transaction
of the id is open), then, in one transaction holding no record, each group's offset sent
back as it was (a later epoch's fence bit kept). A read before the fence could be
overwritten by a straggler's commit and then committed back over it: a marker moved back
would make the replay write that partition again. A producer of the id initialised after
the fence fences this one: its commit fails, nothing is changed, and that writer's own
commit renews the group. A writer with no marker (a partition that never had rows, a
route writer never used, a new scope) is skipped without a producer: its other groups are
committed only beside a marker, so none of them is newer.

A renewal that fails, whatever the error, is logged (redacted of the producer settings'
secrets) and the batch goes on: the markers are read next as always; only their
retention is not extended. The sink then tries it again at its next batch, not half a
retention later: up to this version a failed renewal counted as done, so markers it
failed to renew could expire before the next one, and a replay after that was refused
(its records gone, no marker left) although the broker held them. It warns of a failing
renewal at most once per scope and interval, at debug level between. Each renewal
producer is closed. A transaction a renewal began
and could neither commit nor abort is ended by initialising its id again, on every
broker: left open on Kafka, it would hold back the stable offsets the markers' reads wait
for until ``transaction.timeout.ms``. On Tansu, whose open transactions hold back other
transactions' markers (:mod:`fanout_kafka.abandoned`), the id of every writer that failed
is initialised again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer, TopicPartition

from fanout.errors import TransientSinkError
from fanout.observe.secrets import redact
from fanout_kafka.abandoned import end_transactions
from fanout_kafka.driver_admins import admin_config
from fanout_kafka.journal import letters_group, refused_group
from fanout_kafka.markers import marker_group
from fanout_kafka.membership import (
    NO_OFFSET,
    group_metadata,
    marked_beyond,
    plan_group,
    read_offsets,
)
from fanout_kafka.options import secret_values
from fanout_kafka.producer_init import init_transactions
from fanout_kafka.target import legacy_target_group, target_group
from fanout_kafka.turns import turn

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fanout_kafka.settings import WriterSettings

log = logging.getLogger("fanout_kafka")

ROUTE = "#route-0"
"""The transactional id suffix of the route letters' writer (:mod:`fanout_kafka.deadletter`)."""

KAFKA_OFFSETS_RETENTION_MINUTES = 7 * 24 * 60
"""Kafka's default ``offsets.retention.minutes`` (since 2.0), assumed for the restart window
when the brokers do not report theirs (Tansu keeps offsets for ever and reports none)."""

UNREPORTED_RENEWAL_S = 3600.0
"""How long after a renewal a batch renews the markers again when the brokers do not
report ``offsets.retention.minutes`` (``describe_configs`` refused or unanswered) and are
not recognised as Tansu: hourly, as the partition span and the topic id are committed
again, so a retention down to two hours (Kafka's default before 2.0 was a day) keeps the
markers of a run whose batches go on; one renewal an hour costs a marker read round and
one transaction of offsets per marked writer (19 ms for 2 writers, measured on Tansu)."""


def retention_minutes(value: str | int | None) -> float | None:
    """``offsets.retention.minutes`` as ``describe_configs`` gives it, or ``None`` for no
    value or one that is no positive finite number."""
    try:
        minutes = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return minutes if 0 < minutes < math.inf else None  # also NaN


_UNUSABLE_SAID: set[tuple[str, str | None]] = set()
"""The (bootstrap servers, value) pairs :func:`say_unusable_retention` warned of."""
_UNUSABLE_SAID_LOCK = threading.Lock()


def say_unusable_retention(sink: str, bootstrap_servers: str, value: str | None) -> None:
    """Log that the brokers at ``bootstrap_servers`` do not report
    ``offsets.retention.minutes`` (``value`` ``None``: ``describe_configs`` refused or not
    answered) or report an unusable value (no positive number of minutes), and what fanout
    assumes instead: a warning the first time in the process for those brokers and that
    value, info after. Managed Kafka often refuses ``describe_configs`` on the broker
    resource for good, and a query restarted in a loop, or several sinks on the same
    brokers, open again and again: the same warning at every ``open()`` drowned the log."""
    with _UNUSABLE_SAID_LOCK:
        first = (bootstrap_servers, value) not in _UNUSABLE_SAID
        _UNUSABLE_SAID.add((bootstrap_servers, value))
    if value is None:
        said = (
            "the brokers do not report offsets.retention.minutes (describe_configs refused or "
            "not answered: grant the sink's principal DESCRIBE_CONFIGS on the cluster so it "
            "can read it)"
        )
    else:
        said = (
            f"the brokers report an unusable value of offsets.retention.minutes, {value!r} "
            "(not a positive number of minutes: check the setting on the brokers)"
        )
    log.log(
        logging.WARNING if first else logging.INFO,
        "sink %r: %s; fanout assumes Kafka's default, %d minutes (7 days), as the window to "
        "restart a query that failed in the middle of a batch before the partitions it had "
        "committed are written again, and renews the partition markers every %d minutes "
        "while batches run: a shorter retention on the brokers shortens that window",
        sink, said, KAFKA_OFFSETS_RETENTION_MINUTES, UNREPORTED_RENEWAL_S // 60,
    )  # fmt: skip


MARKER_RETENTION_WARN_MINUTES = 7 * 24 * 60
"""Below a week of marker retention (Kafka's default), ``open()`` warns."""


def say_marker_retention(
    sink: str, bootstrap_servers: str, value: str | None, *, tansu: bool
) -> None:
    """Markers are offsets of member-less groups, which the broker forgets after
    ``offsets.retention.minutes`` (``value``, as the brokers report it): a query restarted
    later than that after a crash in the middle of a batch writes that batch's committed
    partitions again. Say how long the window is (a warning when it is under a week).
    Brokers that do not report it (``describe_configs`` refused or unanswered), or report
    an unusable value, are warned of once per process, brokers and value, at info level
    after (:func:`say_unusable_retention`), naming what fanout assumes (Kafka's default,
    perhaps longer than theirs) and that it renews the markers hourly instead; Tansu
    (``tansu``), which reports none and keeps offsets for ever, only at info level."""
    minutes = retention_minutes(value)
    if minutes is None:
        if tansu:  # Tansu (open() knows it by its cluster id)
            log.info(
                "sink %r: the broker (Tansu) does not report offsets.retention.minutes "
                "and expires no committed offset: the partition markers last as long as "
                "its storage keeps them", sink,
            )  # fmt: skip
            return
        say_unusable_retention(sink, bootstrap_servers, value)
        return
    level = logging.WARNING if minutes < MARKER_RETENTION_WARN_MINUTES else logging.INFO
    log.log(
        level,
        "sink %r: the broker forgets partition markers %d minute(s) (%.1f days) after "
        "their last commit (offsets.retention.minutes): restart a query that failed in "
        "the middle of a batch within that time, or the partitions it had committed are "
        "written again; raise offsets.retention.minutes on the brokers to widen the window",
        sink,
        minutes,
        minutes / 1440,
    )


def renewal_interval_s(
    retention: str | int | None, *, unreported_s: float = UNREPORTED_RENEWAL_S
) -> float:
    """How long after a renewal a batch renews the markers again: half the brokers'
    ``offsets.retention.minutes`` as ``describe_configs`` gives it, so a group is committed
    again well before it can expire; ``unreported_s`` for ``None`` or a value that is no
    positive number (:func:`retention_minutes`)."""
    minutes = retention_minutes(retention)
    return unreported_s if minutes is None else minutes * 60 / 2


@dataclass(frozen=True)
class Writer:
    """One transactional id and the marker group its transactions commit."""

    transactional_id: str
    marker: str

    @property
    def groups(self) -> list[str]:
        """The marker group and every group its transactions commit beside it."""
        marker = self.marker
        return [marker, plan_group(marker), target_group(marker), legacy_target_group(marker),
                letters_group(marker), refused_group(marker), marker + ".route"]  # fmt: skip


@dataclass(frozen=True)
class Renewal:
    """What :func:`renew_markers` committed again: each group with its offset, the
    transactional ids whose renewal failed (logged), and whether the markers could not
    even be read (``unread``: nothing renewed)."""

    renewed: dict[str, int] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    seconds: float = 0.0
    unread: bool = False

    @property
    def complete(self) -> bool:
        """Whether every marker found was committed again (none failed, all were read)."""
        return not self.unread and not self.failed


@dataclass(frozen=True)
class _Failed:
    """A writer's renewal that failed: the error's text (redacted), and whether it began
    a transaction it could neither commit nor abort (left open on the brokers)."""

    said: str
    left_open: bool


def writers(settings: WriterSettings, span: int) -> list[Writer]:
    """The writers of ``settings.scope``: partitions ``0 .. span-1`` and those beyond with a
    marker (as :func:`fanout_kafka.abandoned.end_abandoned_transactions` counts them), then
    the route letters' writer."""
    count = span + marked_beyond(settings, span)
    found = [Writer(settings.transactional_id(p), settings.marker_group(p)) for p in range(count)]
    route = marker_group(settings.scope, f"{settings.sink}#route", 0)
    return [*found, Writer(f"{settings.transactional_id_prefix}{ROUTE}", route)]


def renew_markers(
    settings: WriterSettings, span: int, batch_id: int, *, warn: bool = True
) -> Renewal:
    """Commit again, to the offsets they hold, the groups of every writer of
    ``settings.scope`` that has a marker (the module docstring): one round of marker reads,
    then per such writer a producer, its groups' reads and one transaction of offsets.
    Failures are logged as warnings, or at debug level without ``warn`` (the caller, which
    tries a renewal that failed again at the next batch, warns once per interval).

    :raises fanout.TransientSinkError: when the id of a writer whose renewal left its
        transaction open (on Tansu: whose renewal failed) cannot be initialised again.
    """
    started = time.monotonic()
    config = admin_config(settings.producer, settings.bootstrap_servers)
    timeout_s = settings.operation_timeout_s
    secrets = secret_values(settings.producer)
    level = logging.WARNING if warn else logging.DEBUG
    try:
        every = writers(settings, span)
        markers = read_offsets(config, settings.marker_topic, [w.marker for w in every],
                               timeout_s)  # fmt: skip
    except Exception as exc:  # best effort: the batch reads its markers next anyway
        log.log(level, "sink %r, batch %d: cannot read its markers to commit them again "
                "(their retention is not extended: tried again at the next batch): %s",
                settings.sink, batch_id, _said(exc, secrets))  # fmt: skip
        return Renewal(seconds=time.monotonic() - started, unread=True)
    marked = [w for w, offset in zip(every, markers, strict=True) if offset != NO_OFFSET]
    renewed: dict[str, int] = {}
    failed: list[str] = []
    to_end: list[str] = []
    if marked:
        with ThreadPoolExecutor(max_workers=min(len(marked), 8)) as pool:
            done = list(pool.map(lambda w: _renew(settings, w, secrets), marked))
        for writer, result in zip(marked, done, strict=True):
            if isinstance(result, _Failed):
                failed.append(writer.transactional_id)
                if result.left_open or settings.end_turns is not None:
                    to_end.append(writer.transactional_id)
                log.log(
                    level, "sink %r, batch %d: cannot commit the marker groups of %r again "
                    "(their retention is not extended: tried again at the next batch): %s",
                    settings.sink, batch_id, writer.transactional_id, result.said,
                )  # fmt: skip
            else:
                renewed.update(result)
    if to_end:
        _end(settings, to_end, batch_id, secrets)
    renewal = Renewal(renewed, tuple(failed), time.monotonic() - started)
    log.log(logging.INFO if marked else logging.DEBUG,
            "sink %r, batch %d: %d marker group(s) of %d writer(s) committed again in %.0f ms "
            "(offsets.retention.minutes counts from now)", settings.sink, batch_id,
            len(renewed), len(marked) - len(failed), 1000 * renewal.seconds)  # fmt: skip
    return renewal


def marker_renewal_interval_s(
    configured: float | None, retention: str | None, *, tansu: bool
) -> float:
    """How long after a renewal of a scope's marker groups a batch renews them again:
    ``configured`` (the sink's ``marker_renewal_s``), else half the brokers'
    ``offsets.retention.minutes`` (``retention``, as ``open()`` read it); when they do not
    report it, hourly (:data:`UNREPORTED_RENEWAL_S`: theirs may be shorter than the default
    assumed), or on Tansu (``tansu``: keeps offsets for ever) half Kafka's default."""
    if configured is not None:
        return configured
    unreported = KAFKA_OFFSETS_RETENTION_MINUTES * 30.0 if tansu else UNREPORTED_RENEWAL_S
    return renewal_interval_s(retention, unreported_s=unreported)


@dataclass
class RenewalSchedule:
    """When a sink renews each scope's marker groups, by its times (``time.monotonic``)
    per scope of this ``open()``: of the last complete renewal (``renewed``), of the last
    one that failed (``failed``) and of the last warning of one (``warned``). The sink's
    own mappings, updated in place.

    :param interval_s: how long after a complete renewal the next is due
        (:func:`marker_renewal_interval_s`).
    :param retry_s: how long after a renewal that failed it is tried again (at most
        ``interval_s``).
    """

    renewed: dict[str, float]
    failed: dict[str, float]
    warned: dict[str, float]
    interval_s: float
    retry_s: float

    def renew_when_due(self, settings: WriterSettings, span: int, batch_id: int) -> None:
        """Commit the scope's marker groups again (:func:`renew_markers`) at the first
        batch of the ``open()`` in the scope, and at a later batch once the last complete
        renewal is ``interval_s`` old: no request in the other batches. A renewal that
        failed (for some writer, reading the markers, or raising) is tried again at the
        first batch ``retry_s`` later; its failures are warned at most once per scope and
        interval (at debug level between)."""
        interval = self.interval_s
        scope = settings.scope
        last = self.renewed.get(scope)
        now = time.monotonic()  # before the commits: the retention counts from after it
        if last is not None and now - last < interval:
            return
        failed = self.failed.get(scope)
        if failed is not None and now - failed < min(self.retry_s, interval):
            return
        warned = self.warned.get(scope)
        warn = warned is None or now - warned >= interval
        complete = False
        try:
            complete = renew_markers(settings, span, batch_id, warn=warn).complete
        finally:
            if complete:
                self.renewed[scope] = now
                self.failed.pop(scope, None)
            else:  # counted from its end: a try that waited out its timeout is not retried at once
                self.failed[scope] = time.monotonic()
                if warn:
                    self.warned[scope] = now


def _end(settings: WriterSettings, ids: list[str], batch_id: int, secrets: Sequence[str]) -> None:
    """Initialise ``ids`` again (:func:`fanout_kafka.abandoned.end_transactions`).

    :raises fanout.TransientSinkError: when one cannot be.
    """
    not_ended = end_transactions(settings, ids)
    if not_ended:
        transactional_id, error = next(iter(not_ended.items()))
        raise TransientSinkError(
            f"cannot end the transaction of {transactional_id!r} that a renewal of its marker "
            f"groups left open: {_said(error, secrets)}",
            sink=settings.sink, batch_id=batch_id,
        ) from error  # fmt: skip


def _renew(
    settings: WriterSettings, writer: Writer, secrets: Sequence[str]
) -> dict[str, int] | _Failed:
    """Fence ``writer``'s id, read its groups, commit the ones that hold an offset back in
    one transaction; the groups and offsets committed, or the failure (any error, not only
    Kafka's: nothing committed). The producer is closed either way."""
    timeout_s = settings.operation_timeout_s
    topic = settings.marker_topic
    producer: Any = None
    begun = False
    try:
        config = settings.producer_config(0)
        config["transactional.id"] = writer.transactional_id
        producer = Producer(config)
        with turn(settings.end_turns):
            init_transactions(producer, timeout_s)
        groups = writer.groups
        admin = admin_config(settings.producer, settings.bootstrap_servers)
        offsets = read_offsets(admin, topic, groups, timeout_s)
        held = {g: o for g, o in zip(groups, offsets, strict=True) if o != NO_OFFSET}
        if not held:  # gone since the first read
            return {}
        producer.begin_transaction()
        begun = True
        for group, offset in held.items():
            metadata = group_metadata(settings, 0, group)
            producer.send_offsets_to_transaction([TopicPartition(topic, 0, offset)], metadata,
                                                 timeout_s)  # fmt: skip
        with turn(settings.end_turns):
            producer.commit_transaction(timeout_s)
        return held
    except Exception as exc:
        left_open = begun and not _aborted(producer, settings, secrets)
        return _Failed(_said(exc, secrets), left_open)
    finally:
        if producer is not None:
            _close(producer, settings, secrets)


def _aborted(producer: Any, settings: WriterSettings, secrets: Sequence[str]) -> bool:
    """Abort the renewal's transaction; whether it was (else it may be left open)."""
    try:
        with turn(settings.end_turns):
            producer.abort_transaction(settings.operation_timeout_s)
    except Exception as exc:
        log.debug("%s: renewal not aborted: %s", settings.sink, _said(exc, secrets))
        return False
    return True


def _close(producer: Any, settings: WriterSettings, secrets: Sequence[str]) -> None:
    """Close a renewal producer (it holds no record: nothing to deliver)."""
    try:
        producer.close()
    except Exception as exc:  # closing is best effort
        log.debug("%s: renewal producer not closed: %s", settings.sink, _said(exc, secrets))


def _said(error: BaseException, secrets: Sequence[str]) -> str:
    """``error``'s text (its type when it has none), redacted of ``secrets``."""
    return redact(str(error) or type(error).__name__, secrets)


__all__ = [
    "KAFKA_OFFSETS_RETENTION_MINUTES",
    "MARKER_RETENTION_WARN_MINUTES",
    "ROUTE",
    "UNREPORTED_RENEWAL_S",
    "Renewal",
    "RenewalSchedule",
    "Writer",
    "marker_renewal_interval_s",
    "renew_markers",
    "renewal_interval_s",
    "retention_minutes",
    "say_marker_retention",
    "say_unusable_retention",
    "writers",
]
