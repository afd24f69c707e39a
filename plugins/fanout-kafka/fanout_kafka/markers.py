"""The names of the consumer groups whose committed offsets mark a Kafka sink's progress."""

from __future__ import annotations


def marker_group(scope: str, sink: str, partition: int) -> str:
    """The consumer group whose committed offset marks partition ``partition``'s progress:
    ``fanout/<pipeline>/<sink>/p<partition>`` (``<pipeline>@e<epoch>`` in a new epoch).

    The parts are joined by ``/``, which no pipeline or sink name may hold (see
    :func:`fanout.contract.names.check_name`), so two pipelines or sinks never share a group: the
    dotted names of fanout 0.1 (``fanout.<pipeline>.<sink>.p<n>``) did, for pipeline
    ``orders.eu`` with sink ``kafka`` and pipeline ``orders`` with sink ``eu.kafka``.
    """
    return f"fanout/{scope}/{sink}/p{partition}"


def span_group(scope: str, sink: str) -> str:
    """The consumer group whose committed offset is the sink's *partition span* in
    ``scope``: the most partitions it has written a batch of the scope in,
    ``fanout/<pipeline>/<sink>/partitions`` (recorded by the driver before the first write
    of each ``open()``: :func:`fanout_kafka.membership.record_span`). No marker group
    (``p`` and digits), group of one (``<marker group>.<what>``) or topic-id group (one
    part more) has this name."""
    return f"fanout/{scope}/{sink}/partitions"


FENCED_BIT = 1 << 62
"""Set in a marker's offset when a later epoch's start closed its scope to the replaced
query's tasks (:mod:`fanout_kafka.fence`); markers are ``batch + 1``, far below it."""
NO_MARKER = -1001
"""librdkafka's OFFSET_INVALID: the group has committed nothing (as
:data:`fanout_kafka.membership.NO_OFFSET`)."""


def is_fenced(offset: int) -> bool:
    """Whether a marker's committed offset carries a later epoch's fence."""
    return offset >= FENCED_BIT


def real_offset(offset: int) -> int:
    """A marker's offset as the readers on the driver take it: the fence cleared, and
    ``0`` (a fence lifted from a marker that had none) as none (:data:`NO_MARKER`)."""
    if offset >= FENCED_BIT:
        offset -= FENCED_BIT
    return NO_MARKER if offset <= 0 else offset


def legacy_marker_group(scope: str, sink: str, partition: int) -> str:
    """The group fanout 0.1 used for the same marker (ambiguous: see :func:`marker_group`);
    read once per sink to refuse a batch that fanout 0.1 left half committed."""
    return f"fanout.{scope}.{sink}.p{partition}"


def default_transactional_id_prefix(pipeline: str, sink: str) -> str:
    """The sink's default ``transactional_id_prefix``: ``fanout/<pipeline>/<sink>``
    (partition ``p`` uses ``<prefix>-<p>``, a dead-letter writer ``<prefix>#<source>-<p>``).

    Joined by ``/`` like the marker groups, so no two pipelines or sinks share an id: the
    ``-`` of fanout up to 0.x (:func:`legacy_transactional_id_prefix`) is also a name
    character, and pipeline ``a-b`` with sink ``c`` and pipeline ``a`` with sink ``b-c``
    both had ``fanout-a-b-c``: each fenced the other's producers. A ``-<p>`` suffix cannot
    make two ids equal either: the partition is digits after the last ``-``.
    """
    return f"fanout/{pipeline}/{sink}"


def legacy_transactional_id_prefix(pipeline: str, sink: str) -> str:
    """The default prefix before :func:`default_transactional_id_prefix` (ambiguous). A sink
    on the default initialises these ids once per ``open()`` before it reads its markers,
    which fences a producer of the old version and aborts a transaction it left open
    (:func:`fanout_kafka.abandoned.fence_legacy_transactions`)."""
    return f"fanout-{pipeline}-{sink}"
