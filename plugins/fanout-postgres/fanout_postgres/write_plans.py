"""On the driver: which write plan a batch is written by, cached per batch schema, and
checked against the table at each batch.

:class:`WritePlans` owns the caches (the plans, the table's columns each was made on, the
batch each was last checked at) and whether the first write creates the table; the sink
holds one, pickled with it. Each call is given what it reads of the sink as a
:class:`Planning`, made by the sink when it calls (its options as ``open()`` resolved them,
its driver engine, its way of naming errors). The plan itself: :mod:`fanout_postgres.plan`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fanout.errors import ConfigurationError, SchemaMismatchError, SinkError
from fanout_postgres.catalog import resolved_schema, rules_problem
from fanout_postgres.catalog import shape as catalog_shape
from fanout_postgres.plan import (
    PlanError,
    PlanOptions,
    TargetInfo,
    WritePlan,
    build_plan,
    create_table,
    created_target,
    map_columns,
    reflect,
    table_to_create,
)

logger = logging.getLogger("fanout_postgres.sink")  # the sink's: its records keep that name


@dataclass(frozen=True)
class Planning:
    """What planning reads of the sink, made by the sink at each call (never kept)."""

    options: PlanOptions
    """The sink's options, without the schemas the table names resolve to (read on the
    plan's connection: :func:`options_on`)."""
    create_table: bool
    engine: Callable[[], Any]
    """The sink's driver engine, asked for only when the table is read."""
    configured: Callable[[PlanError], ConfigurationError]
    """A plan refused at ``open()``, from option ``batch_schema``."""
    mismatch: Callable[[PlanError, int | None], SchemaMismatchError]
    """A plan refused for a batch (``None``: ``check_schema``, for ``fanout validate``)."""
    unchecked: Callable[[Exception, int | None], ConfigurationError | SinkError]
    """The table could not be read or created."""
    forget_replay_read: Callable[[], None]
    """The kit's :meth:`fanout.partitioned.sink.PartitionedSink.forget_replay_read`."""


def options_on(conn: Any, options: PlanOptions) -> PlanOptions:
    """``options`` with the schemas the table and the dead-letter table resolve to on
    ``conn``: the statements name the table's, so a temporary table of the same name (first
    on the search path, like the staging table) cannot take the rows; the dead-letter
    table's as the driver created and reads it, which a ``search_path`` in option
    ``settings`` (the write connections') would otherwise not find, or find another."""
    schema = resolved_schema(conn, options.table)
    return dataclasses.replace(
        options,
        schema=schema,
        dead_letter_schema=resolved_schema(conn, options.dead_letter_table),
    )


def target_of(
    conn: Any, planning: Planning, spark_schema: Any, *, create: bool, describe: bool = True
) -> TargetInfo:
    """The table, reflected. When it is missing and ``create_table`` is on: created from
    ``spark_schema`` (``create``), or only described as it would be created (``describe``),
    else refused: it was there, or created, since ``open()``."""
    options = planning.options
    table = options.table
    info = reflect(conn, table)
    if info is None and planning.create_table and (create or describe):
        pairs = map_columns(spark_schema.fieldNames(), options.columns)
        keys = options.keys or []
        if create:
            create_table(conn, table, spark_schema, pairs, keys)
            logger.info("sink %r: created table %s", options.sink, table)
            info = reflect(conn, table)
        else:
            info = created_target(table, table_to_create(table, spark_schema, pairs, keys))
    elif info is None and planning.create_table:
        raise PlanError(
            f"table {table} does not exist: dropped while the run wrote it? "
            "create_table creates a missing table only at a run's first write, after the "
            "check that the target still holds what the ledger marks written there; "
            "start the run again"
        )
    if info is None:
        raise PlanError(f"table {table} does not exist")
    return info


@dataclass(eq=False)
class WritePlans:
    """The sink's write plans, one per batch schema (its ``json()``), with the table's
    columns each was made on and the batch each was last checked at; ``unmade``: ``open()``
    found the table missing, and the first plan creates it."""

    plans: dict[str, WritePlan] = field(default_factory=dict)
    shapes: dict[str, Any] = field(default_factory=dict)
    checked: dict[str, int] = field(default_factory=dict)
    unmade: bool = False

    def planned(self, spark_schema: Any) -> WritePlan | None:
        """The plan of batches of ``spark_schema`` made already, without reading the table."""
        return self.plans.get(spark_schema.json())

    def plan(self, planning: Planning, spark_schema: Any, batch_id: int | None) -> WritePlan:
        """The write plan of batches of ``spark_schema`` (cached per schema), the table
        created first when it is missing and ``create_table`` is on. ``batch_id`` is
        ``None`` at ``open()`` (option ``batch_schema``): a mismatch is then a
        :class:`ConfigurationError`, else a :class:`SchemaMismatchError` of the batch.

        ``open()`` plans only a table that exists (a missing one is checked as it would be
        created, :meth:`check`): it runs before the run's lost-target check
        (``holds_batch``), and a table it created would make the retry of a refused run
        find one, which the progress marks (they outlive the table) then say holds the
        batches. So the first batch's plan creates it, and no later one: a table dropped
        while the run writes it (no check runs between batches) fails the batch, and the
        restart's check refuses it, instead of being created again empty."""
        cache_key = spark_schema.json()
        plan = self.plans.get(cache_key)
        if plan is not None and (batch_id is None or self.checked.get(cache_key) == batch_id):
            return plan
        engine = planning.engine()
        table = planning.options.table
        try:
            if plan is not None:
                with engine.connect() as conn:
                    self.recheck(planning, conn, cache_key, batch_id)  # type: ignore[arg-type]
                plan = self.plans.get(cache_key)
                if plan is not None:
                    return plan
            with engine.begin() as conn:
                info = target_of(conn, planning, spark_schema, create=self.unmade, describe=False)
                plan = build_plan(info, options_on(conn, planning.options), spark_schema)
                ruled = rules_problem(conn, table)
                if ruled is not None:  # a rule made since open(): the shape changed
                    raise PlanError(ruled)
                shape = catalog_shape(conn, table)
                types = {row[0]: row[1] for row in shape}
                plan = dataclasses.replace(
                    plan, column_types=tuple(types.get(t, "") for _, t in plan.columns)
                )
        except PlanError as exc:
            if batch_id is None:
                raise planning.configured(exc) from None
            raise planning.mismatch(exc, batch_id) from None
        except Exception as exc:
            raise planning.unchecked(exc, batch_id) from None
        self.unmade = False  # there now: dropped later, it is not created again
        self.plans[cache_key] = plan
        self.shapes[cache_key] = shape
        if batch_id is not None:
            self.checked[cache_key] = batch_id
        return plan

    def recheck(self, planning: Planning, conn: Any, cache_key: str, batch_id: int) -> None:
        """At each batch: the table's columns (one catalog query) against those its cached
        plan was made on. A column altered (``ALTER TABLE ... TYPE``), added or dropped
        since drops the plan, and the batch is planned anew against the table as it is:
        binary COPY encodes each field for the planned type. The partition input
        ``check_replay`` made on the dropped plan is dropped with it."""
        if cache_key not in self.plans:
            return
        table = planning.options.table
        if catalog_shape(conn, table) != self.shapes.get(cache_key):
            logger.info(
                "sink %r, batch %d: table %s changed since its write plan was made; "
                "planning anew", planning.options.sink, batch_id, table,
            )  # fmt: skip
            del self.plans[cache_key]
            planning.forget_replay_read()
            return
        self.checked[cache_key] = batch_id

    def check(self, planning: Planning, spark_schema: Any, *, at_open: bool) -> None:
        """:meth:`plan`'s checks, a missing table described as it would be created, and
        nothing kept or created: at ``open()`` (``at_open``, option ``batch_schema``: a
        :class:`ConfigurationError`) or for ``fanout validate`` (``check_schema``: a
        :class:`SchemaMismatchError` without a batch id)."""
        try:
            with planning.engine().connect() as conn:
                info = target_of(conn, planning, spark_schema, create=False)
                build_plan(info, options_on(conn, planning.options), spark_schema)
        except PlanError as exc:
            if at_open:
                raise planning.configured(exc) from None
            raise planning.mismatch(exc, None) from None
        except Exception as exc:
            raise planning.unchecked(exc, None) from None
