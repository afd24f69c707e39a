"""What a Kafka sink's partition markers say of a batch on the driver: held whole, in part,
not at all, or cannot tell (no marker of the epoch left). The answer of
:meth:`fanout_kafka.sink.KafkaSink.holds_batch`, ``holds_batch_of``, ``records_gone`` and
the first write's read for a vanished writer (:mod:`fanout_kafka.vanished`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fanout.contract.sink import PartlyHeld

log = logging.getLogger("fanout_kafka")


def markers_hold(
    config: dict[str, Any],
    *,
    sink: str,
    name: str,
    marker_topic: str,
    topic: str | None,
    partitions: int,
    pipeline: str,
    epoch: int,
    batch_id: int,
    letters_waiting: Callable[[int], int],
    timeout_s: float,
) -> bool | PartlyHeld | None:
    """What the markers of sink ``name`` (``sink``'s own, or another's on its marker topic)
    in the scope of ``pipeline`` and ``epoch`` say of batch ``batch_id``: the markers of
    its ``partitions``, then of those beyond for as long as each has one, read within
    ``timeout_s`` (:func:`fanout_kafka.membership.held_partitions`). A later batch
    committed, or every partition holding it with none of the letters they named waiting
    (``letters_waiting``, given the partition count): ``True``; some, or letters waiting:
    :class:`fanout.PartlyHeld`; none: ``False``; no marker of the epoch at all: ``None``
    (for ``sink``'s own markers logged: it cannot tell whether ``topic`` holds the
    batch)."""
    from fanout.contract.batch import pipeline_scope
    from fanout_kafka.markers import marker_group, span_group
    from fanout_kafka.membership import held_partitions

    scope = pipeline_scope(pipeline, epoch)
    committed, count = held_partitions(
        config,
        marker_topic,
        lambda p: marker_group(scope, name, p),
        batch_id,
        partitions,
        timeout_s,
        span_group=span_group(scope, name),
    )
    if committed is None:  # a later batch committed: this one did, whole
        return True
    if committed == 0 and count == 0:
        if name != sink:  # another sink's: none of the epoch under that name
            return None
        log.info(
            "sink %r: no partition marker of epoch %s is left on marker topic %r (none "
            "committed, or offsets.retention.minutes expired them): cannot tell whether "
            "topic %r holds batch %s", name, epoch, marker_topic, topic, batch_id,
        )  # fmt: skip
        return None
    if committed == 0:
        return False
    if count is not None and committed >= count:
        waiting = letters_waiting(count)
        return PartlyHeld(committed, count, letters=waiting) if waiting else True
    return PartlyHeld(committed, count)


__all__ = ["markers_hold"]
