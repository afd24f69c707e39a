"""What an engine needs to write one batch to one Delta table: the configured sink's
settings, without the sink (so the engines do not import it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fanout.contract.dead_letters import DeadLetterTarget
    from fanout.delta_tables.kept import KeptTable
    from fanout.partitioned.task import HookPlugins


@dataclass(frozen=True)
class DeltaTarget:
    """One Delta sink's write settings (see :class:`fanout_delta.sink.DeltaSink`).

    :param dead_letters: where rows with a null merge key, a partition value no Delta
        table can keep, or a value the table's constraints refuse, go (``None``: they fail
        the batch), as fanout resolved the sink's ``dead_letter`` option.
    :param hook_plugins: the per-partition commit hook implementers, called by the
        executors' append in each task once its files are written (``None``: none).
    :param kept: the table's snapshot the sink keeps between batches (delta-rs engine;
        ``None``: opened every batch).
    :param ledger: the pipeline's ledger as the commands fanout prints name it
        (``SinkContext.ledger``; ``None``: unknown), for the refusal of a re-planned batch.
    :param stepped_back: why the executors' append stepped back to the driver's writer,
        as logged (the sink's, kept between batches: logged once per sink, not per batch).
    :param sinks: the names of the sinks the pipeline configures (``SinkContext.sinks``;
        ``()``: unknown), for the refusal of a renamed sink's first write
        (:func:`fanout_delta.fence.batch_version`).
    """

    name: str
    path: str
    mode: str
    keys: Sequence[str] | None = None
    order_by: Sequence[str] | None = None
    partition_by: Sequence[str] | None = None
    merge_schema: bool = False
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)  # credentials
    configuration: Mapping[str, str | None] | None = None
    dead_letters: DeadLetterTarget | None = None
    write_from: str = "executors"
    max_merge_rows: int | None = None
    hook_plugins: HookPlugins | None = None
    ledger: str | None = None
    kept: KeptTable | None = field(default=None, compare=False, repr=False)
    stepped_back: set[str] | None = field(default=None, compare=False, repr=False)
    sinks: tuple[str, ...] = ()

    @property
    def rewrite_harmless(self) -> bool:
        """Whether writing a batch the table holds again leaves it as one write would: a
        merge (unconditional, by key) without a dead-letter target."""
        return self.mode == "merge" and self.dead_letters is None

    def latest_table(self) -> Any:
        """The table at its latest version (``None``: none yet), now the caller's: the
        kept snapshot brought up to date, or opened."""
        if self.kept is not None:
            return self.kept.latest()
        from fanout.delta_tables import io

        return io.open_table(self.path, self.storage_options)

    def keep_table(self, table: Any) -> None:
        """Leave ``table`` (this table at the version the caller ended on) for the next
        batch."""
        if self.kept is not None:
            self.kept.keep(table)
