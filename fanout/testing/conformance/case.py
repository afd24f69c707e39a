"""What a plugin author hands the suite: :class:`SinkUnderTest`, their sink's
configuration and a way to read its target; and the shape of the suite's batches
(``SCHEMA``) and the name it gives the sink (``NAME``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

SCHEMA = "id BIGINT, v STRING"
NAME = "under_test"


@dataclass
class SinkUnderTest:
    """A sink type as the suite sees it.

    :param config: the sink's configuration without ``name`` (``{"type": ..., **options}``),
        JSON-serialisable: the kill check rebuilds it in another process.
    :param read: the rows the target holds (mappings with ``id``; ``v`` when kept).
    :param dead_letter: a ``dead_letter`` option value the sink takes (``None``: the route
        check is skipped).
    :param read_dead_letters: the dead letters' rows (default: the Delta table at
        ``dead_letter``).
    :param keyed: whether ``id`` is the sink's key, or a row whose ``id`` is null is one the
        sink refuses (the null-key check applies; with ``dead_letter``, the row must end in
        the dead letters once, also after a replay whose ledger mark was lost).
    :param schema_drift: what a new column does: ``"refuses"`` (an error naming it) or
        ``"writes"``.
    :param secret: a secret value held by ``failing_config`` (``None``: check skipped).
    :param failing_config: a configuration with ``secret`` that fails (at open or write).
    :param env: environment variables the kill check's subprocess needs (``PYTHONPATH``).
    :param plugins: the modules registering the sink type (``fanout_sink_types``), for a
        plugin that is not installed: each the module itself or its importable name, as
        ``FanOut(plugins=...)`` takes them (:func:`fanout.hooks.registry.plugin_object`);
        given to ``FanOut(plugins=...)``, and by name to the kill check's driver (with the
        directory each was imported from on its ``sys.path``, ahead of site-packages only).
    :param commits_in_pieces: whether an attempt commits the batch in pieces that a failure
        can leave behind (a partitioned sink: one transaction per Spark partition), so that
        a route changed between a partial attempt and its replay must be refused or its
        outcome exact. ``None``: a :class:`fanout.partitioned.PartitionedSink` does (the
        suite vetoes partition 0's commit through ``fanout_partition_commit``); a sink
        committing each batch whole does not (the check is skipped).
    :param recreate: drop the target and create it again empty, as an operator or a deploy
        script would (outside fanout: the same name and columns, e.g. ``DROP TABLE`` then
        ``CREATE TABLE``); ``None``: the re-created half of the
        :meth:`fanout.Sink.target_replaced` check is skipped.
    :param drop: delete the target (no re-creation: a ``DROP TABLE``, a directory removed);
        ``None``: the check that :meth:`fanout.Sink.holds_batch` answers ``False`` for a
        deleted target (records kept beside it outlive it) is skipped.
    :param refused_value: a value of ``v`` the target refuses (the fixture sets the target up
        so, e.g. a ``CHECK`` constraint); ``None``: the check is skipped. With
        ``dead_letter``, such a row must go there once (not into the target), also when the
        mark is lost and the batch replayed; without, the batch must fail naming the value.
    """

    config: Mapping[str, Any]
    read: Callable[[], Sequence[Mapping[str, Any]]]
    dead_letter: str | None = None
    read_dead_letters: Callable[[], Sequence[Mapping[str, Any]]] | None = None
    keyed: bool = False
    schema_drift: Literal["refuses", "writes"] = "refuses"
    secret: str | None = None
    failing_config: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    plugins: Sequence[ModuleType | str] = ()
    commits_in_pieces: bool | None = None
    refused_value: str | None = None
    recreate: Callable[[], None] | None = None
    drop: Callable[[], None] | None = None

    def sink(self, **extra: Any) -> dict[str, Any]:
        """The configuration as ``FanOut(sinks=[...])`` takes it."""
        return {**self.config, "name": NAME, **extra}

    def ids(self) -> list[int]:
        """The ids the target holds, sorted (duplicates kept)."""
        return sorted(int(row["id"]) for row in self.read())
