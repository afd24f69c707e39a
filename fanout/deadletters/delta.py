"""The ``delta`` dead-letter kind: a Delta table every sink can use, written with delta-rs.

Each batch's letters of one source (and partition) land in one commit carrying the
transaction ``batch.idempotency_key.derived(letter_kind(source, partition))``, so a replay
writes them once. The table has :func:`fanout.deadletters.layout.letter_schema`'s layout.

A commit of route letters also carries, in its custom metadata, the transaction it holds
(``fanout.route.txn``: ``<app id>@<version>``), the route's fingerprint
(``fanout.route.fingerprint``) and text (``fanout.route``): a replay finding the batch's
letters there under another fingerprint is refused (:mod:`fanout.deadletters.route_letters`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.dead_letters import DELTA, DeadLetter, RouteStamp, Source, letter_kind
from fanout.contract.earlier_letters import HeldLetters
from fanout.contract.locations import shown_location
from fanout.deadletters.layout import letter_schema, to_records
from fanout.deadletters.route_letters import check_unchanged
from fanout.delta_tables import io as deltaio
from fanout.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch
    from fanout.contract.sink import Sink

log = logging.getLogger(__name__)

TXN_KEY = "fanout.route.txn"
FINGERPRINT_KEY = "fanout.route.fingerprint"
ROUTE_KEY = "fanout.route"


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
        """``Delta table <path>``, the path as fanout prints a location (a password in it
        masked: :func:`fanout.contract.locations.shown_location`): errors, logs and the
        refusals of a moved ``dead_letter`` name the target so."""
        return f"Delta table {shown_location(self.path)}"

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
        route: RouteStamp | None = None,
    ) -> int:
        """Append the batch's letters once; return how many the batch has. With ``route``,
        first refuse a batch whose route letters are here under another route."""
        import pyarrow as pa

        key = batch.idempotency_key.derived(letter_kind(source, partition))
        txn = f"{key.app_id}@{key.version}"
        if route is not None:
            self._check_route(batch, route, key.app_id, key.version, txn)
        if letters:
            data = pa.Table.from_pylist(to_records(batch, letters, source), schema=letter_schema())
            metadata = None
            if route is not None:
                metadata = {TXN_KEY: txn, FINGERPRINT_KEY: route.fingerprint}
                metadata[ROUTE_KEY] = route.text
            deltaio.append_once(
                self.path, data, key.app_id, key.version, self.storage_options, metadata
            )
        return len(letters)

    def replace(self, batch: Batch, letters: Sequence[DeadLetter], *, source: Source) -> int:
        """Make ``letters`` the batch's letters of ``source`` here, whatever an earlier
        attempt wrote; return how many the batch has. For a sink whose replay may refuse
        other rows than the attempt it replays (a PostgreSQL upsert rewrites every
        partition, and a row a foreign key refused then may be taken now): :meth:`write`
        would skip the replay's letters once the earlier attempt's are recorded, keeping a
        letter of a row the replay wrote. One read of the batch's letters; when they
        differ, one commit replacing them (``overwrite`` with a predicate on the batch's
        letters) with the batch's transaction, so a kill leaves either set, never both. A commit
        lost to another writer of the table (delta-rs refuses it as concurrent) is read and
        tried again, :data:`~fanout.delta_tables.io.COMMIT_ATTEMPTS` times in all."""
        import pyarrow as pa
        from deltalake import write_deltalake

        key = batch.idempotency_key.derived(letter_kind(source, None))
        filters = [*_of_batch(batch), ("source", "=", source)]
        predicate = deltaio.predicate(filters)
        data = pa.Table.from_pylist(to_records(batch, letters, source), schema=letter_schema())
        commit = deltaio.commit_properties({key.app_id: key.version})
        for attempt in range(1, deltaio.COMMIT_ATTEMPTS + 1):
            table = deltaio.open_table(self.path, self.storage_options)
            if table is None:
                return self.write(batch, letters, source=source)
            # the snapshot the overwrite commits on: a later commit is delta-rs's to check
            held = deltaio.read_arrow(table, columns=["row", "reason"], filters=filters)
            if _letter_texts(held) == _letter_texts(data):
                return len(letters)
            try:
                write_deltalake(
                    table, data, mode="overwrite", predicate=predicate, commit_properties=commit
                )
                return len(letters)
            except Exception as exc:
                # another writer committed since the read (a sink's letters of a batch
                # whose files the predicate cannot rule out, a compaction): read again
                if not deltaio.is_commit_conflict(exc) or attempt == deltaio.COMMIT_ATTEMPTS:
                    raise
                log.info("%s: lost a commit race replacing %s@%d, reading again: %s",
                         self.path, key.app_id, key.version, exc)  # fmt: skip
        raise AssertionError("unreachable")

    def _check_route(
        self, batch: Batch, route: RouteStamp, app_id: str, version: int, txn: str
    ) -> None:
        """Refuse when this batch's letters are here under another route (see the module
        docstring); nothing to check when the batch has none here."""
        table = deltaio.open_table(self.path, self.storage_options)
        done = deltaio.transaction_version(table, app_id)
        if table is None or done is None or done < version:
            return
        commit = deltaio.commit_metadata(table, TXN_KEY, txn)
        if commit is None and done > version:
            return  # a later batch's letters: this one had none, or they are long gone
        fingerprint = None if commit is None else commit.get(FINGERPRINT_KEY)
        recorded = None if commit is None else commit.get(ROUTE_KEY)
        check_unchanged(
            batch,
            route,
            fingerprint=None if fingerprint is None else str(fingerprint),
            recorded=None if recorded is None else str(recorded),
            target=self.describe(),
        )

    def letters_held(self, batch: Batch) -> HeldLetters:
        """What this table holds of ``batch``'s letters (asked when the sink's
        ``dead_letter`` moved since an attempt of the batch: :mod:`fanout.deadletters.moved`):
        whether it holds its route letters (with the route of their commit's metadata) and
        the partitions of its refused rows; one filtered read of two columns, and of the
        log's newest commits when it holds route letters. Nothing when the table does not
        exist."""
        table = deltaio.open_table(self.path, self.storage_options)
        if table is None:
            return HeldLetters(self.describe())
        rows = deltaio.read_arrow(table, columns=["source", "partition"],
                                  filters=_of_batch(batch))  # fmt: skip
        found = set(zip(rows.column("source").to_pylist(), rows.column("partition").to_pylist(),
                        strict=True))  # fmt: skip
        route = any(source == "route" for source, _ in found)
        fingerprint = text = None
        if route:
            key = batch.idempotency_key.derived(letter_kind("route"))
            commit = deltaio.commit_metadata(table, TXN_KEY, f"{key.app_id}@{key.version}")
            if commit is not None:
                fingerprint = (
                    None if commit.get(FINGERPRINT_KEY) is None else str(commit[FINGERPRINT_KEY])
                )
                text = None if commit.get(ROUTE_KEY) is None else str(commit[ROUTE_KEY])
        refused = frozenset(p for source, p in found if source == "refused")
        return HeldLetters(self.describe(), route, fingerprint, text, refused)

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
        return f"<DeltaDeadLetters {shown_location(self.path)!r}>"


def delta_target(location: str, sink: Sink) -> DeltaDeadLetters:
    """The ``delta`` kind's factory: the table at ``location``, with the sink's
    ``storage_options`` attribute (if any) for object stores."""
    options: Any = getattr(sink, "storage_options", None)
    storage = options if isinstance(options, Mapping) else None
    deltaio.refuse_unusable_location(
        location, f"sink {sink.name!r}: dead_letter {location!r}", storage
    )
    return DeltaDeadLetters(location, storage)


TableRole = tuple[str, str, "str | None"]
"""``(kind, description, location)`` of a table a pipeline uses: kind ``ledger``, ``spool``,
``sink`` (a sink's own table) or ``dead letters``; the description names it in errors."""


def table_roles(
    ledger: str | None,
    spool: str | None,
    sinks: Mapping[str, Sink],
    dead_letters: Mapping[str, object],
) -> list[TableRole]:
    """The Delta tables a pipeline writes, each with its role (for
    :func:`refuse_shared_tables`): the ledger, the spool, each sink's ``path`` and each
    sink's Delta dead-letter target (``dead_letters``, by sink name; other kinds are not
    Delta tables). ``FanOut(...)`` and ``fanout validate`` read them alike."""
    roles: list[TableRole] = [("ledger", "the ledger", ledger), ("spool", "the spool", spool)]
    for name, sink in sinks.items():
        path = getattr(sink, "path", None)
        if isinstance(path, str):
            roles.append(("sink", f"the table of sink {name!r} (option 'path')", path))
        target = dead_letters.get(name)
        if isinstance(target, DeltaDeadLetters):
            roles.append(
                ("dead letters", f"the dead letters of sink {name!r} (option 'dead_letter')",
                 target.path)
            )  # fmt: skip
    return roles


def refuse_shared_tables(pipeline: str, roles: Iterable[TableRole]) -> None:
    """Refuse one table holding roles of two kinds (the ledger, the spool, a sink's table,
    dead letters): their layouts differ, so the second kind's first write (a batch's first
    dead letter, say) failed on the other's schema in every replay, or created the table
    with its own layout where the other expected its own. Roles of one kind may share a
    table (two sinks' dead letters; two sinks appending to one table). Locations are
    compared and named masked (:func:`fanout.contract.locations.shown_location`: a table
    named with two SAS tokens is one table, and the refusal carries no secret)."""
    from fanout.contract.locations import same_table_key

    held: dict[str, tuple[str, str]] = {}
    for kind, description, location in roles:
        if not location:
            continue
        shown = shown_location(location)
        first_kind, first = held.setdefault(same_table_key(shown), (kind, description))
        if first_kind != kind:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: {first} and {description} are one table, "
                f"{shown!r}: their rows have other layouts, so the second would fail on "
                "the first's schema in every batch; give each its own location"
            )


def _letter_texts(table: Any) -> list[tuple[Any, Any]]:
    """The ``(row, reason)`` of each letter of ``table``, sorted: two sets of letters of one
    batch compared regardless of order."""
    rows = table.column("row").to_pylist()
    reasons = table.column("reason").to_pylist()
    return sorted(zip(rows, reasons, strict=True), key=repr)


def _of_batch(batch: Batch) -> list[deltaio.Filter]:
    """The filters selecting the letters ``batch``'s sink wrote of it (both sources)."""
    return [
        ("pipeline", "=", batch.pipeline),
        ("sink", "=", batch.sink_name),
        ("epoch", "=", batch.info.epoch),
        ("batch_id", "=", batch.batch_id),
    ]
