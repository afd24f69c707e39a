"""``fanout validate`` writes nothing: the ledger is checked, not created; a sink type that
declares ``read_only_check`` is opened with ``SinkContext(checking=True)`` and its "would"
changes are printed as ``INFO``; a sink type that does not (written before the flag, its
``open()`` may create things) is not opened at all but reported ``SKIP``. No JVM."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from fanout import Batch, Sink, SinkContext, hookimpl
from fanout.app.runner import load_pipeline
from fanout.app.validate import report, run_checks
from fanout.errors import ConfigurationError, SchemaMismatchError, SinkUnreachableError


class MakesItsDirectory(Sink):
    """A sink type written before ``read_only_check``: its ``open()`` creates things."""

    guarantees: ClassVar = ("idempotent",)  # no at-least-once WARN line in these checklists

    def __init__(self, name: str, *, directory: str) -> None:
        super().__init__(name)
        self.directory = directory

    def open(self, context: SinkContext) -> None:
        Path(self.directory).mkdir(parents=True, exist_ok=True)

    def write(self, batch: Batch) -> int:
        return 0


class ChecksItsDirectory(MakesItsDirectory):
    """The same sink honouring ``context.checking``."""

    read_only_check: ClassVar[bool] = True
    opened_with: ClassVar[list[bool]] = []
    ledgers: ClassVar[list[str | None]] = []

    def open(self, context: SinkContext) -> None:
        ChecksItsDirectory.opened_with.append(context.checking)
        ChecksItsDirectory.ledgers.append(context.ledger)
        if not Path(self.directory).exists():
            if context.checking:
                context.would(f"create the directory {self.directory}")
                return
        super().open(context)


class ClaimsItsDirectory(ChecksItsDirectory):
    """A sink that must have its directory to itself."""

    def exclusive_resources(self, pipeline: str) -> tuple[str, ...]:
        return (f"the directory {self.directory}",)


class _Plugin:
    @staticmethod
    @hookimpl
    def fanout_sink_types() -> dict[str, type[Sink]]:
        return {
            "makes-dir": MakesItsDirectory,
            "checks-dir": ChecksItsDirectory,
            "claims-dir": ClaimsItsDirectory,
        }


PIPELINE = """
[pipeline]
name = "p"
ledger = "{root}/ledger"
checkpoint = "{root}/checkpoint"

[source]
format = "rate"

[[sinks]]
type = "makes-dir"
name = "legacy"
directory = "{root}/legacy"

[[sinks]]
type = "checks-dir"
name = "careful"
directory = "{root}/careful"

[[sinks]]
type = "checks-dir"
name = "careful"
directory = "{root}/again"
"""


def test_validate_opens_only_sinks_that_check_read_only_and_writes_nothing(
    tmp_path: Path, with_test_sinks: Callable[[object], None]
) -> None:
    with_test_sinks(_Plugin())
    file = tmp_path / "p.toml"
    file.write_text(PIPELINE.format(root=tmp_path))
    ChecksItsDirectory.opened_with.clear()
    ChecksItsDirectory.ledgers.clear()
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    assert [check.line() for check in checklist.checks] == [
        "  OK    source: builds with its schema and transform",
        f"  OK    ledger {tmp_path}/ledger: opens",
        f"  INFO  ledger {tmp_path}/ledger: would create the ledger table",
        "  OK    sink legacy: options",
        "  SKIP  sink legacy: opens its target: MakesItsDirectory does not declare "
        "read_only_check, so its open() might create or change things; `fanout run` opens it",
        "  OK    sink careful: options",
        "  OK    sink careful: opens its target",
        f"  INFO  sink careful: would create the directory {tmp_path}/careful",
        "  FAIL  sink careful: options: two sinks are named 'careful'; sink names must be "
        "unique (they key the ledger)",
    ]
    assert ChecksItsDirectory.opened_with == [True]
    assert ChecksItsDirectory.ledgers == [f"{tmp_path}/ledger"]  # as a run names it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]
    assert list(checklist.specs) == ["legacy", "careful"]
    out = io.StringIO()
    with pytest.raises(ConfigurationError) as failed:
        report(checklist.checks, out)
    assert out.getvalue().splitlines() == [c.line() for c in checklist.checks]
    assert str(failed.value) == (  # INFO lines are not checks; a SKIP is not a failure
        "1 of 7 checks failed:\n  - sink careful: options: two sinks are named 'careful'; "
        "sink names must be unique (they key the ledger)"
    )


def test_validate_fails_two_sinks_claiming_one_exclusive_resource(
    tmp_path: Path, with_test_sinks: Callable[[object], None]
) -> None:
    with_test_sinks(_Plugin())
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/c"\n'
        '[source]\nformat = "rate"\n'
        + "".join(
            f'[[sinks]]\ntype = "claims-dir"\nname = "{name}"\ndirectory = "{tmp_path}/{d}"\n'
            for name, d in (("a", "shared"), ("b", "own"), ("c", "shared"))
        )
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    assert [c.line() for c in checklist.checks if c.failed] == [
        "  FAIL  sinks: exclusive resources: pipeline 'p': sinks 'a' and 'c' both use the "
        f"directory {tmp_path}/shared, which a sink must have to itself (they would fence or "
        "overwrite each other in every batch): give each its own"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml"]


def _shared_table_pipelines(root: Path) -> dict[str, tuple[str, str, str]]:
    """A pipeline file's sinks (TOML), the two roles the failure names and the location as
    the second role gives it."""
    own, alias = f"{root}/t", f"{root}/alias/t"
    table = "the table of sink 'a' (option 'path')"
    letters = "the dead letters of sink 'a' (option 'dead_letter')"
    return {
        "letters in the sink's own table": (
            f'name = "a"\npath = "{own}"\ndead_letter = "{own}/"\n', f"{table} and {letters}",
            f"{own}/",
        ),
        "letters in the sink's table through a linked directory": (
            f'name = "a"\npath = "{own}"\ndead_letter = "{alias}"\n', f"{table} and {letters}",
            alias,
        ),
        "a sink writing the ledger": (
            f'name = "a"\npath = "{root}/ledger"\n', f"the ledger and {table}", f"{root}/ledger"
        ),
        "a sink writing the spool": (
            f'name = "a"\npath = "{root}/spool"\non_failure = "lag"\n',
            f"the spool and {table}", f"{root}/spool",
        ),
        "letters in another sink's table": (
            f'name = "a"\npath = "{own}"\n[[sinks]]\ntype = "delta"\nname = "b"\n'
            f'path = "{root}/u"\ndead_letter = "{own}"\n',
            f"{table} and the dead letters of sink 'b' (option 'dead_letter')", own,
        ),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "letters in the sink's own table",
        "letters in the sink's table through a linked directory",
        "a sink writing the ledger",
        "a sink writing the spool",
        "letters in another sink's table",
    ],
)
def test_validate_fails_one_table_in_two_roles(tmp_path: Path, case: str) -> None:
    """``FanOut(...)`` and ``fanout run`` refused it; ``fanout validate`` reported the
    pipeline valid."""
    (tmp_path / "alias").symlink_to(tmp_path, target_is_directory=True)
    sinks, roles, location = _shared_table_pipelines(tmp_path)[case]
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/c"\n'
        f'spool = "{tmp_path}/spool"\n[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\n'
        + sinks
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    problem = (
        f"pipeline 'p': {roles} are one table, {location!r}: their rows have other layouts, so "
        "the second would fail on the first's schema in every batch; give each its own "
        "location"
    )
    assert [c.line() for c in checklist.checks if c.failed] == [
        f"  FAIL  tables: each in one role: {problem}"
    ]
    with pytest.raises(ConfigurationError) as failed:  # `fanout validate` exits 2
        report(checklist.checks, io.StringIO())
    assert str(failed.value).endswith(f"checks failed:\n  - tables: each in one role: {problem}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias", "p.toml"]


def test_a_sink_context_opens_for_a_run_by_default() -> None:
    context = SinkContext("p")
    assert context.checking is False
    assert context.changes == []
    assert Sink.read_only_check is False


def test_validate_refuses_a_spool_holding_batches_of_a_sink_that_no_longer_lags(
    tmp_path: Path,
) -> None:
    import datetime as dt
    from types import SimpleNamespace

    import pyarrow as pa
    from pyspark.sql import types as T

    from fanout.contract.batch import BatchInfo
    from fanout.spool.table import Spool

    spool = Spool(str(tmp_path / "spool"), "p")
    spool.open()
    df = SimpleNamespace(schema=T.StructType([T.StructField("x", T.LongType())]))
    now = dt.datetime.now(dt.UTC)
    spool.add(df, BatchInfo("p", 3), ["bronze"], now, arrow=lambda: pa.table({"x": [1]}))
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/c"\n'
        f'spool = "{tmp_path}/spool"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "bronze"\npath = "{tmp_path}/bronze"\n'
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    assert checklist.checks[-1].line() == (
        f"  FAIL  spool {tmp_path}/spool: holds no batch for a sink that no longer lags: "
        f"pipeline 'p': sink 'bronze' still needs batches from the spool at {tmp_path}/spool "
        "(the oldest: batch 3 of epoch 0) but no longer has on_failure='lag'; it would skip "
        "them. Keep on_failure='lag' until it has caught up: `fanout status --ledger "
        f"{tmp_path}/ledger --pipeline p --spool {tmp_path}/spool` lists it 'lagging' or "
        "'catching up' until then (once every sink is live, the table has no state column). "
        "Or, if it must never get them, give them up (they are released from the spool, the "
        "sink's next batch writes it): `fanout ledger skip --ledger "
        f"{tmp_path}/ledger --pipeline p --sink bronze --through 3 --epoch 0 --spool "
        f"{tmp_path}/spool --release-spooled`."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.toml", "spool"]

    # its ledger mark holds batch 3 (caught up, or given up by a skip): nothing is skipped
    from fanout.ledger.delta import DeltaLedger
    from fanout.ledger.entry import LedgerEntry

    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    ledger.mark_committed(LedgerEntry("p", "bronze", 3, "committed", query_id="q", rows=1))
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    assert checklist.checks[-1].line() == (
        f"  OK    spool {tmp_path}/spool: holds no batch for a sink that no longer lags"
    )


def test_a_failed_check_keeps_the_cause_chain_delta_rs_writes_after_its_first_line() -> None:
    """delta-rs puts why on the lines after the first (each started by a coloured arrow):
    the checklist, one line a check, said only "Kernel error -> Generic S3 error"."""
    from fanout.app.validate import Check, _check

    delta_rs = (
        "Delta sink 'bronze': cannot open the Delta table at 's3://b/t': Kernel error -> "
        "Generic S3 error\n          \x1b[31m\u21b3\x1b[0m Error performing GET "
        "http://127.0.0.1:1/b/t/_delta_log/_last_checkpoint\n           \x1b[31m\u21b3\x1b[0m "
        "tcp connect error\n            \x1b[31m\u21b3\x1b[0m Connection refused (os error 111)\n"
    )
    spark = (
        "[UNRESOLVED_COLUMN] A column `amout` cannot be resolved. Did you mean `amount`?\n== SQL =="
    )

    def fails(text: str) -> Any:
        def step() -> None:
            raise ConfigurationError(text)

        return step

    checks: list[Check] = []
    _check(checks, "sink bronze: opens its target", fails(delta_rs))
    _check(checks, "sink paid: route", fails(spark))
    assert [c.line() for c in checks] == [
        "  FAIL  sink bronze: opens its target: Delta sink 'bronze': cannot open the Delta "
        "table at 's3://b/t': Kernel error -> Generic S3 error -> Error performing GET "
        "http://127.0.0.1:1/b/t/_delta_log/_last_checkpoint -> tcp connect error -> "
        "Connection refused (os error 111)",
        "  FAIL  sink paid: route: [UNRESOLVED_COLUMN] A column `amout` cannot be resolved. "
        "Did you mean `amount`?",
    ]


def test_validate_fails_a_spool_the_store_refuses_naming_it_masked(tmp_path: Path) -> None:
    """A spool on a store delta-rs cannot read (``az://`` without credentials): one failed
    check naming the spool, its password masked, and the store's error (before: delta-rs'
    bare ``OSError`` ended ``fanout validate`` in a traceback)."""
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\n'
        f'checkpoint = "{tmp_path}/checkpoint"\nspool = "az://user:LongSecretPassw0rd@x/spool"\n'
        f'[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "lake"\n'
        f'path = "{tmp_path}/lake"\non_failure = "lag"\n'
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    failed = [check.line() for check in checklist.checks if check.line().startswith("  FAIL")]
    assert len(failed) == 1, failed
    assert failed[0].startswith(
        "  FAIL  spool az://user:***@x/spool: can be read: cannot read the spool at "
        "az://user:***@x/spool (check the path, the store's credentials"
    ), failed
    assert "LongSecretPassw0rd" not in failed[0]


class ChecksItsColumns(ChecksItsDirectory):
    """The same sink, with a ``check_schema`` of its own: it takes ``id`` only."""

    def check_schema(self, schema: Any) -> None:
        extra = [n for n in schema.names if n != "id"]
        if extra:
            raise ConfigurationError(f"sink {self.name!r}: no column for {extra}")


def test_the_schema_check_of_a_sink_without_check_schema_is_skipped_not_ok() -> None:
    """An ``OK  target takes the routed schema`` for a type that does not implement
    ``check_schema`` said a check passed that never ran."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from fanout.app.validate import fit_checks
    from fanout.sink_spec import SinkSpec

    class Source:
        schema = StructType([StructField("id", LongType()), StructField("v", StringType())])

    checks: list[Any] = []
    for sink in (
        ChecksItsDirectory("plain", directory="d"),
        ChecksItsColumns("own", directory="d"),
    ):
        fit_checks(checks, sink.name, SinkSpec(sink), Source(), None)
    assert [check.line() for check in checks] == [
        "  SKIP  sink plain: target takes the routed schema: ChecksItsDirectory does not "
        "implement check_schema, so its first write is what finds a column its target cannot "
        "take",
        "  FAIL  sink own: target takes the routed schema: sink 'own': no column for ['v']",
    ]


class MismatchesItsColumns(ChecksItsDirectory):
    """Raises the error README's contract names for ``check_schema``, which has no batch."""

    def check_schema(self, schema: Any) -> None:
        if extra := [n for n in schema.names if n != "id"]:
            raise SchemaMismatchError(f"no column {extra}", sink=self.name, columns=extra)


def test_check_schema_raises_a_schema_mismatch_without_a_batch_id() -> None:
    """``SchemaMismatchError`` required ``batch_id``, which ``check_schema`` has none of: a
    plugin raising it as the README says failed with a ``TypeError`` about the argument."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from fanout.app.validate import fit_checks
    from fanout.sink_spec import SinkSpec

    class Source:
        schema = StructType([StructField("id", LongType()), StructField("v", StringType())])

    checks: list[Any] = []
    fit_checks(checks, "own", SinkSpec(MismatchesItsColumns("own", directory="d")), Source(), None)
    assert [check.line() for check in checks] == [
        "  FAIL  sink own: target takes the routed schema: sink 'own': no column ['v']"
    ]


class RefusesItsToken(ChecksItsDirectory):
    """Quotes its token when its server refuses it; declares the token a secret."""

    def __init__(self, name: str, *, directory: str, token: str) -> None:
        super().__init__(name, directory=directory)
        self.token = token

    def secret_values(self) -> list[str]:
        return [self.token]

    def open(self, context: SinkContext) -> None:
        raise ConfigurationError(f"sink {self.name!r}: token {self.token} refused")


class _TokenPlugin:
    @staticmethod
    @hookimpl
    def fanout_sink_types() -> dict[str, type[Sink]]:
        return {"token-dir": RefusesItsToken}


def test_validate_masks_the_secret_a_sink_declares_in_its_failed_open(
    tmp_path: Path, with_test_sinks: Callable[[object], None]
) -> None:
    """``fanout validate`` printed the token ``FanOut(...)`` masks: the secrets of the
    sinks it opened were never registered nor masked."""
    with_test_sinks(_TokenPlugin())
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\n'
        f'checkpoint = "{tmp_path}/checkpoint"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "token-dir"\nname = "t"\ndirectory = "{tmp_path}/t"\n'
        'token = "T0ken-S3cret"\n'
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    assert [c.line() for c in checklist.checks if c.failed] == [
        "  FAIL  sink t: opens its target: sink 't': token *** refused"
    ]


def test_a_column_arrow_cannot_take_fails_the_schema_check_of_a_sink_without_one() -> None:
    """The SKIP for a type without ``check_schema`` dropped the conversion to Arrow that
    the check made first: an interval of months, which ``batch.arrow()`` cannot convert,
    was no longer a FAIL in ``fanout validate`` nor refused by ``fanout run`` before its
    stream started (its first batch failed instead)."""
    from pyspark.sql.types import LongType, StructField, StructType, YearMonthIntervalType

    from fanout.app.validate import fit_checks
    from fanout.sink_spec import SinkSpec

    class Source:
        schema = StructType(
            [StructField("id", LongType()), StructField("term", YearMonthIntervalType())]
        )

    checks: list[Any] = []
    fit_checks(
        checks, "plain", SinkSpec(ChecksItsDirectory("plain", directory="d")), Source(), None
    )
    assert [(check.kind, check.failed) for check in checks] == [("check", True)]
    assert (
        checks[0]
        .line()
        .startswith(
            "  FAIL  sink plain: target takes the routed schema: "
            "[UNSUPPORTED_DATA_TYPE_FOR_ARROW_CONVERSION] YearMonthIntervalType(0, 1) is not "
            "supported"
        )
    ), checks[0].line()


class UnreachableBackfill(ChecksItsDirectory):
    """A sink whose target cannot be reached to say whether it can give back its batches."""

    def backfill_source(self, pipeline: str) -> Any:
        raise SinkUnreachableError("connection refused", sink=self.name)


class _BackfillPlugin:
    @staticmethod
    @hookimpl
    def fanout_sink_types() -> dict[str, type[Sink]]:
        return {"checks-dir": ChecksItsDirectory, "far-dir": UnreachableBackfill}


def test_an_unreachable_failure_of_a_pipeline_check_names_the_sink_its_error_names(
    tmp_path: Path, with_test_sinks: Callable[[object], None]
) -> None:
    """The report recovered the unreachable sinks by parsing each check's text: the
    ``backfill_from`` check is no sink's, so it named a sink ``backfill_from``. Each check
    now carries its sink, or for a pipeline's check, the sink its error names."""
    with_test_sinks(_BackfillPlugin())
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\n'
        f'checkpoint = "{tmp_path}/checkpoint"\nspool = "{tmp_path}/spool"\n'
        '[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "far-dir"\nname = "far.away"\ndirectory = "{tmp_path}/far"\n'
        f'[[sinks]]\ntype = "checks-dir"\nname = "new"\ndirectory = "{tmp_path}/new"\n'
        'on_failure = "lag"\nbackfill_from = "far.away"\n'
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    failed = [c for c in checklist.checks if c.failed]
    assert [(c.line(), c.sink) for c in failed] == [
        (
            "  FAIL  backfill_from: names a sink that holds its batches: "
            "sink 'far.away': connection refused",
            "far.away",
        )
    ]
    with pytest.raises(SinkUnreachableError) as unreachable:
        report(checklist.checks, io.StringIO())
    assert unreachable.value.sink == "far.away"
    assert str(unreachable.value) == (
        "1 of 8 checks failed:\n  - backfill_from: names a sink that holds its batches: "
        "sink 'far.away': connection refused"
    )
    assert {c.what: c.sink for c in checklist.checks if c.kind != "info"} == {
        "source: builds with its schema and transform": None,
        f"ledger {tmp_path}/ledger: opens": None,
        "sink far.away: options": "far.away",
        "sink far.away: opens its target": "far.away",
        "sink new: options": "new",
        "sink new: opens its target": "new",
        f"spool {tmp_path}/spool: set for the sinks that lag or backfill": None,
        "backfill_from: names a sink that holds its batches": "far.away",
    }
