"""Committing a scope's marker groups again when a run starts, so the broker keeps them.

The markers are offsets of member-less consumer groups, which a Kafka broker deletes
``offsets.retention.minutes`` (7 days by default) after the group's last commit. A
partition commits its groups only in a transaction that wrote rows, so a pipeline idle
for longer than that lost them, and a crash replay then could not tell which partitions
held its batch. So at the first batch of each ``open()`` in a scope (never per batch),
before the markers are read, the driver commits every writer's groups again, each to the
offset it holds: the partitions' ``<prefix>-<p>`` (the sink's partition span, and the
markers beyond it) and the route letters' ``<prefix>#route-0``.

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

A renewal that fails is logged and the batch goes on: the markers are read next as
always; only their retention is not extended. On Tansu, whose open transactions hold
back other transactions' markers (:mod:`fanout_kafka.abandoned`), the ids of the writers
that failed are initialised again before the markers are read.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from fanout_kafka.abandoned import end_abandoned_transactions
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
from fanout_kafka.producer_init import init_transactions
from fanout_kafka.target import legacy_target_group, target_group
from fanout_kafka.turns import turn

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings

log = logging.getLogger("fanout_kafka")

ROUTE = "#route-0"
"""The transactional id suffix of the route letters' writer (:mod:`fanout_kafka.deadletter`)."""


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
    """What :func:`renew_markers` committed again: each group with its offset, and the
    transactional ids whose renewal failed (logged)."""

    renewed: dict[str, int] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    seconds: float = 0.0


def writers(settings: WriterSettings, span: int) -> list[Writer]:
    """The writers of ``settings.scope``: partitions ``0 .. span-1`` and those beyond with a
    marker (as :func:`fanout_kafka.abandoned.end_abandoned_transactions` counts them), then
    the route letters' writer."""
    count = span + marked_beyond(settings, span)
    found = [Writer(settings.transactional_id(p), settings.marker_group(p)) for p in range(count)]
    route = marker_group(settings.scope, f"{settings.sink}#route", 0)
    return [*found, Writer(f"{settings.transactional_id_prefix}{ROUTE}", route)]


def renew_markers(settings: WriterSettings, span: int, batch_id: int) -> Renewal:
    """Commit again, to the offsets they hold, the groups of every writer of
    ``settings.scope`` that has a marker (the module docstring): one round of marker reads,
    then per such writer a producer, its groups' reads and one transaction of offsets.

    :raises fanout.TransientSinkError: on Tansu, when the ids of writers whose renewal
        failed cannot be initialised again (their transactions could hold markers back).
    """
    started = time.monotonic()
    config = admin_config(settings.producer, settings.bootstrap_servers)
    timeout_s = settings.operation_timeout_s
    try:
        every = writers(settings, span)
        markers = read_offsets(config, settings.marker_topic, [w.marker for w in every],
                               timeout_s)  # fmt: skip
    except (KafkaException, TimeoutError) as exc:
        log.warning("sink %r, batch %d: cannot read its markers to commit them again (their "
                    "retention is not extended by this run): %s", settings.sink, batch_id,
                    exc)  # fmt: skip
        return Renewal(seconds=time.monotonic() - started)
    marked = [w for w, offset in zip(every, markers, strict=True) if offset != NO_OFFSET]
    renewed: dict[str, int] = {}
    failed: list[str] = []
    if marked:
        with ThreadPoolExecutor(max_workers=min(len(marked), 8)) as pool:
            for writer, done in zip(marked, pool.map(lambda w: _renew(settings, w), marked),
                                    strict=True):  # fmt: skip
                if isinstance(done, BaseException):
                    failed.append(writer.transactional_id)
                    log.warning(
                        "sink %r, batch %d: cannot commit the marker groups of %r again (their "
                        "retention is not extended by this run): %s", settings.sink, batch_id,
                        writer.transactional_id, done,
                    )  # fmt: skip
                else:
                    renewed.update(done)
    if failed and settings.end_turns is not None:
        end_abandoned_transactions(settings, 0, batch_id, extra_ids=failed,
                                   why="a renewal of the marker groups left open")  # fmt: skip
    renewal = Renewal(renewed, tuple(failed), time.monotonic() - started)
    log.log(logging.INFO if marked else logging.DEBUG,
            "sink %r, batch %d: %d marker group(s) of %d writer(s) committed again in %.0f ms "
            "(offsets.retention.minutes counts from now)", settings.sink, batch_id,
            len(renewed), len(marked) - len(failed), 1000 * renewal.seconds)  # fmt: skip
    return renewal


def _renew(settings: WriterSettings, writer: Writer) -> dict[str, int] | BaseException:
    """Fence ``writer``'s id, read its groups, commit the ones that hold an offset back in
    one transaction; the groups and offsets committed, or the error (nothing committed)."""
    config = settings.producer_config(0)
    config["transactional.id"] = writer.transactional_id
    timeout_s = settings.operation_timeout_s
    topic = settings.marker_topic
    producer = Producer(config)
    begun = False
    try:
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
    except (KafkaException, TimeoutError) as exc:
        if begun:
            _abort(producer, settings, timeout_s)
        return exc


def _abort(producer: Any, settings: WriterSettings, timeout_s: float) -> None:
    """Abort the renewal's transaction (best effort: the partition's next
    ``init_transactions`` aborts what is left)."""
    try:
        with turn(settings.end_turns):
            producer.abort_transaction(timeout_s)
    except KafkaException as exc:
        log.debug("%s: renewal not aborted: %s", settings.sink, exc)


__all__ = ["ROUTE", "Renewal", "Writer", "renew_markers", "writers"]
