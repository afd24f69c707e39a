"""The batch as :meth:`fanout.Sink.write` gets it: an empty one (nothing written, the
batch marked), and one with a new column (schema drift: refused by a
:class:`fanout.SchemaMismatchError` naming it, or written, as
``SinkUnderTest(schema_drift=...)`` declares).

The contract: docs/architecture.md §8 (docs/architecture/08-sinks-and-plugins.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.errors import BatchFailedError, SchemaMismatchError
from fanout.testing.conformance.case import NAME, SCHEMA, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _assert_ids, _assert_rows


class BatchShapeChecks(Kit):
    """An empty batch and a batch with a new column (module docstring)."""

    def test_an_empty_batch_writes_nothing_and_is_marked(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        assert fan.process(self._batch(spark, []), self._info(0))[NAME].rows == 0
        assert fan.process(self._batch(spark, []), self._info(0)) == {}
        assert under_test.ids() == []

    def test_schema_drift(self, spark: Any, under_test: SinkUnderTest, tmp_path: Path) -> None:
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        fan.process(self._batch(spark, [(1, "a")]), self._info(0))
        drifted = self._batch(spark, [(2, "b", 7)], SCHEMA + ", extra INT")
        if under_test.schema_drift == "writes":
            try:
                result = fan.process(drifted, self._info(1))[NAME]
            except BatchFailedError as failed:
                pytest.fail(
                    f"{_DRIFT} refused it: {failed.failures[NAME]!r}; say "
                    "SinkUnderTest(schema_drift='refuses') if it refuses new columns"
                )
            _assert_rows(result, 1, "a batch of 1 row with a new column")
            _assert_ids(under_test, [1, 2], "after a batch adding a column was written")
            return
        try:
            fan.process(drifted, self._info(1))
        except BatchFailedError as failed:
            error = failed.failures[NAME]
        else:
            pytest.fail(
                f"{_DRIFT} wrote it, and SinkUnderTest(schema_drift='refuses') (the default) "
                "says it refuses it: say schema_drift='writes' if it writes new columns, or "
                "raise a SchemaMismatchError naming the column"
            )
        if not isinstance(error, SchemaMismatchError):
            pytest.fail(
                f"{_DRIVER} refused it with {error!r}, not a SchemaMismatchError: a driver's "
                "error reaches the operator as a failed write, not as a schema mismatch "
                "naming the columns. Compare the batch's columns with the target's in "
                f"write() and {_RAISE}"
            )
        if "extra" not in error.columns or f"sink {NAME!r}, batch 1" not in str(error):
            pytest.fail(
                f"{_DRIFT} refused it with a SchemaMismatchError that does not name the "
                f"column: {error!r} (columns={error.columns!r}); {_RAISE}"
            )
        _assert_ids(under_test, [1], "after batch 1, which added a column, was refused")


_DRIFT = "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink"
_DRIVER = _DRIFT.replace("the sink", "the sink's write()")
_RAISE = (
    "raise SchemaMismatchError(message, sink=self.name, batch_id=batch.batch_id, "
    "columns=[...]) (from fanout import SchemaMismatchError) naming the columns the target "
    "lacks, in columns and in the message; implementing check_schema(schema) too, raising "
    "SchemaMismatchError(message, sink=self.name, columns=[...]) (no batch_id there), lets "
    "`fanout validate` refuse such a source before any batch is written "
    "(docs/writing-sinks.md: check_schema)"
)
