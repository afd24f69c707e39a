"""The ``delta`` dead-letter kind: a Delta table every sink can use, written with delta-rs.

Each batch's letters of one source (and partition) land in one commit carrying the
transaction ``batch.idempotency_key.derived(letter_kind(source, partition))``, so a replay
writes them once. The table has :func:`fanout.deadletters.layout.letter_schema`'s layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.dead_letters import DeadLetter, Source, letter_kind
from fanout.deadletters.layout import letter_schema, to_records
from fanout.deadletters.target import DELTA
from fanout.delta_tables import io as deltaio

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch
    from fanout.contract.sink import Sink


class DeltaDeadLetters:
    """A Delta table of dead letters (configuration only: picklable to the executors).

    :param path: the table's location (local path or object-store URI); created on the
        first write.
    :param storage_options: passed to delta-rs for object stores.
    """

    kind = DELTA

    def __init__(self, path: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.storage_options = dict(storage_options or {})

    def describe(self) -> str:
        """``Delta table <path>``."""
        return f"Delta table {self.path}"

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
    ) -> int:
        """Append the batch's letters once; return how many the batch has."""
        import pyarrow as pa

        if letters:
            data = pa.Table.from_pylist(to_records(batch, letters, source), schema=letter_schema())
            key = batch.idempotency_key.derived(letter_kind(source, partition))
            deltaio.append_once(self.path, data, key.app_id, key.version, self.storage_options)
        return len(letters)

    def read_rows(self, pipeline: str, sink: str, key: tuple[int, int]) -> pa.Table:
        """The ``row`` column (JSON) of the letters ``sink`` of ``pipeline`` set aside
        itself (source ``refused``, not a route's) in batch ``key`` (``(epoch, batch id)``);
        empty when the table does not exist."""
        import pyarrow as pa

        if deltaio.open_table(self.path, self.storage_options) is None:
            return pa.table({"row": pa.array([], pa.string())})
        filters: list[deltaio.Filter] = [
            ("pipeline", "=", pipeline),
            ("sink", "=", sink),
            ("epoch", "=", key[0]),
            ("batch_id", "=", key[1]),
            ("source", "=", "refused"),
        ]
        return deltaio.read_delta(
            self.path, columns=["row"], filters=filters, storage_options=self.storage_options
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeltaDeadLetters) and (self.path, self.storage_options) == (
            other.path,
            other.storage_options,
        )

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"<DeltaDeadLetters {self.path!r}>"


def delta_target(location: str, sink: Sink) -> DeltaDeadLetters:
    """The ``delta`` kind's factory: the table at ``location``, with the sink's
    ``storage_options`` attribute (if any) for object stores."""
    options: Any = getattr(sink, "storage_options", None)
    storage = options if isinstance(options, Mapping) else None
    deltaio.refuse_unusable_location(
        location, f"sink {sink.name!r}: dead_letter {location!r}", storage
    )
    return DeltaDeadLetters(location, storage)
