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


def legacy_marker_group(scope: str, sink: str, partition: int) -> str:
    """The group fanout 0.1 used for the same marker (ambiguous: see :func:`marker_group`);
    read once per sink to refuse a batch that fanout 0.1 left half committed."""
    return f"fanout.{scope}.{sink}.p{partition}"
