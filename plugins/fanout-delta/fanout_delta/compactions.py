"""When a Delta sink compacts its table (``compact_every``), and what it does about a
compaction gone wrong: taken back at the sink's open when a killed run left it unchecked,
named among the sink's standing problems when it cannot be
(:mod:`fanout.delta_tables.compaction`). A compaction or repair that fails is logged, never
raised: the batch it follows is committed, and the next compaction looks again."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fanout.delta_tables import io as deltaio
from fanout.errors import CompactionError

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.sink import SinkContext

# The sink's logger: its records keep the name users' logging settings give.
logger = logging.getLogger("fanout_delta.sink")


@dataclass(frozen=True)
class Compactions:
    """The compactions of Delta sink ``sink``'s table at ``path``, one every ``every``
    batches (``None``: none)."""

    sink: str
    path: str
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)  # credentials
    every: int | None = None

    def after(self, batch_id: int, engine: str, batch: Batch) -> None:
        """Compact the table after batch ``batch_id`` committed, when it is the last of
        ``every`` (with ``engine``'s compaction: a Spark job, or delta-rs)."""
        every = self.every
        if not every or (batch_id + 1) % every:
            return
        try:
            if engine == "spark":
                from fanout_delta.spark_engine import compact_spark

                compact_spark(batch.df.sparkSession, self.path)
                logger.info("sink %r, batch %d: compacted %s", self.sink, batch_id, self.path)
            else:
                from fanout_delta.rs_engine import compact_rs

                metrics = compact_rs(
                    self.path,
                    self.storage_options,
                    f"sink {self.sink!r} table {self.path}",
                )
                logger.info(
                    "sink %r, batch %d: compacted %s (%s files removed, %s added)",
                    self.sink, batch_id, self.path,
                    metrics.get("numFilesRemoved"), metrics.get("numFilesAdded"),
                )  # fmt: skip
        except CompactionError as exc:  # rows stay duplicated: say so loudly
            logger.error("sink %r, batch %d: %s", self.sink, batch_id, exc)
        except Exception:
            logger.warning(
                "sink %r, batch %d: compaction of %s failed; the batch is committed, the "
                "next compaction will retry", self.sink, batch_id, self.path, exc_info=True,
            )  # fmt: skip

    def repair(self, table: Any, context: SinkContext) -> None:
        """Take back a compaction of the table a run of this sink (or another's) committed
        and was killed before checking (:func:`fanout.delta_tables.compaction.repair_unchecked`);
        a repair that fails is logged, as a failed compaction is: the next one looks again.
        Without ``compact_every`` (removed since the crash) only when fanout compacted the
        table since its mark (``worth_a_scan``); the history of a table without fanout's mark
        is not read (``repair_unchecked`` returns at once): its next fanout compaction
        reads it back to the newest checked record.
        ``fanout validate`` (``context.checking``) changes nothing: it tells what the run
        would take back, and logs a refusal as the run does."""
        from fanout.delta_tables.compaction import (
            repair_unchecked,
            worth_a_scan,
            would_take_back,
        )

        what = f"sink {self.sink!r} table {self.path}"
        try:
            if not (self.every or worth_a_scan(table)):
                return
            if not context.checking:
                repair_unchecked(table, what, self.storage_options)
                return
            for version in would_take_back(table, what, self.storage_options):
                context.would(
                    f"take back the compaction committed at version {version} of {self.path} "
                    "(its process was killed before checking it: rows are in the table twice)"
                )
        except CompactionError as exc:  # rows stay duplicated: say so loudly
            logger.error("sink %r: %s", self.sink, exc)
        except Exception:
            logger.warning(
                "sink %r: checking the earlier compactions of %s failed; the next compaction "
                "checks them again", self.sink, self.path, exc_info=True,
            )  # fmt: skip

    def refused(self) -> Sequence[str]:
        """A fanout compaction of the table that left rows twice and cannot be taken back
        (:func:`fanout.delta_tables.compaction.refused_compaction`), as its refusal says it."""
        from fanout.delta_tables.compaction import refused_compaction

        table = deltaio.open_table(self.path, self.storage_options)
        what = f"sink {self.sink!r} table {self.path}"
        found = None if table is None else refused_compaction(table, what, self.storage_options)
        return () if found is None else (found,)
