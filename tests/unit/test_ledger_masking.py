"""What a pipeline writes to its ledger and shows as a sink's lag is masked of every
secret the pipeline knows: its locations' passwords and all its sinks' secrets."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from fanout.contract.batch import BatchInfo
from fanout.errors import (
    BatchFailedError,
    ConfigurationError,
    LagLimitError,
    SinkUnreachableError,
)
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.observe.logs import known_secrets
from fanout.observe.secrets import error_chain
from fanout.retry import RetryPolicy
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.record import Recorder
from fanout.testing import make_batch
from tests.unit.fakes import SchemaFrame, ScriptedSink

CHECKPOINT_PASSWORD = "Ckpt-pw-5813"
OTHER_PASSWORD = "Other-sink-pw-2207"
LEAK = RuntimeError(f"at s3://ck:{CHECKPOINT_PASSWORD}@b/c, beside {OTHER_PASSWORD}")


class _Guarded(ScriptedSink):
    def secret_values(self) -> list[str]:
        return [OTHER_PASSWORD]


def test_the_recorder_masks_a_failed_rows_error_of_every_secret_it_is_given() -> None:
    ledger = MemoryLedger()
    recorder = Recorder(ledger, RetryPolicy(0, 0.0), (CHECKPOINT_PASSWORD, OTHER_PASSWORD))
    recorder.failed(make_batch([{"x": 1}]), 1, datetime.now(UTC), 0.1, LEAK)
    assert [e.error for e in ledger.entries] == ["RuntimeError: at s3://ck:***@b/c, beside ***"]


def test_a_lagging_sinks_error_and_ledger_row_hide_the_pipelines_other_secrets(
    tmp_path: Path,
) -> None:
    down = ScriptedSink("down", always_fail=LEAK)
    ledger = MemoryLedger()
    fan = FanOut(
        "masked", ledger,
        [SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"})), _Guarded("guarded")],
        retries=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
        checkpoint_location=f"nofs://ck:{CHECKPOINT_PASSWORD}@b/c",
    )  # fmt: skip
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("masked", 0, "q"))
        said = "RuntimeError: at s3://ck:***@b/c, beside ***"
        assert fan.lagging.lags()["down"].error == f"SinkWriteError: sink 'down', batch 0: {said}"
        failed = [e.error for e in ledger.entries if e.status == "failed"]
        assert failed == [f"SinkWriteError: sink 'down', batch 0: {said}"]
    finally:
        fan.close()


class _Asked(ScriptedSink):
    """Holds every batch, or cannot tell, saying its password either way."""

    def __init__(self, name: str, *, fails: bool) -> None:
        super().__init__(name)
        self.fails = fails

    def secret_values(self) -> list[str]:
        return [OTHER_PASSWORD]

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        if self.fails:
            raise RuntimeError(f"login with {OTHER_PASSWORD} refused")
        return True

    def harmless_rewrite(self) -> str | None:
        return f"it upserts into pg://u:{OTHER_PASSWORD}@h/db by key"


def test_what_a_sink_says_when_asked_for_a_batch_it_may_hold_is_masked_of_its_secrets() -> None:
    from fanout.steps.unmarked import ask, lost_mark

    cannot_tell = ask(_Asked("s", fails=True), "p", 0, 3)
    assert cannot_tell.why == "RuntimeError: login with *** refused"
    held = ask(_Asked("s", fails=False), "p", 0, 3)
    assert held.harmless == "it upserts into pg://u:***@h/db by key"
    entry = lost_mark("p", 0, held, "q", None, "recorded")
    assert entry.error is not None and OTHER_PASSWORD not in entry.error


LEDGER_PASSWORD = "Ledger-pw-7741"
LEDGER_KEY = "Ledger-key-9902"


class _StoredLedger(MemoryLedger):
    """A ledger in memory that says it is at an object store's location, as a
    :class:`fanout.ledger.delta.DeltaLedger` given to ``FanOut`` says."""

    path = f"s3://k:{LEDGER_PASSWORD}@b/ledger"


def test_a_ledger_given_as_an_object_has_its_location_password_masked_too() -> None:
    """``FanOut(ledger=DeltaLedger("s3://k:pw@b/ledger"))``: the password of the ledger's
    location was a secret of the pipeline only when the ledger was given as a string."""
    ledger = _StoredLedger()
    leak = RuntimeError(f"cannot reach the ledger at {ledger.path}")
    fan = FanOut("masked", ledger, [ScriptedSink("down", always_fail=leak)], retries=0)
    try:
        with pytest.raises(BatchFailedError) as failure:
            fan.process(SchemaFrame([1, 2]), BatchInfo("masked", 0, "q"))
    finally:
        fan.close()
    said = "SinkWriteError: sink 'down', batch 0: RuntimeError: cannot reach the ledger at "
    said += "s3://k:***@b/ledger"
    assert [e.error for e in ledger.entries if e.status == "failed"] == [said]
    assert LEDGER_PASSWORD not in str(failure.value)


def test_a_delta_ledgers_storage_credentials_are_secrets_of_the_pipeline(tmp_path: Path) -> None:
    ledger = DeltaLedger(
        str(tmp_path / "ledger"), storage_options={"aws_secret_access_key": LEDGER_KEY}
    )
    fan = FanOut("masked", ledger, [ScriptedSink("a")])
    assert LEDGER_KEY in fan.secrets
    assert LEDGER_KEY in known_secrets()  # the log handlers' and the command's too


class _Unopenable(ScriptedSink):
    """Its ``open`` fails quoting the checkpoint's location and another sink's password."""

    def open(self, context: Any) -> None:
        raise RuntimeError(
            f"cannot open beside s3://ck:{CHECKPOINT_PASSWORD}@b/c with {OTHER_PASSWORD}"
        )


def test_a_sinks_open_error_is_masked_of_every_secret_of_the_pipeline() -> None:
    """The error ``FanOut`` raises when a sink cannot open was masked of that sink's own
    secrets only."""
    with pytest.raises(ConfigurationError) as failure:
        FanOut(
            "masked", MemoryLedger(), [_Unopenable("broken"), _Guarded("guarded")],
            checkpoint_location=f"nofs://ck:{CHECKPOINT_PASSWORD}@b/c",
        )  # fmt: skip
    assert str(failure.value).startswith(
        "sink 'broken': cannot open: RuntimeError: cannot open beside s3://ck:***@b/c with "
        "*** (raised by _Unopenable.open(): "
    )
    assert failure.value.__cause__ is None and failure.value.__suppress_context__


def test_an_unopened_lagging_sinks_error_is_masked_of_every_secret_of_the_pipeline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lag-policy sink that cannot be opened starts behind; its error, as the log says
    it (to an application's own handlers, which mask nothing), was masked of its own
    secrets only."""
    broken = _UnreachableAtOpen("broken")
    fan = FanOut(
        "masked", MemoryLedger(),
        [SinkSpec(broken, lag=lag_policy("broken", {"on_failure": "lag"})), _Guarded("guarded")],
        spool=str(tmp_path / "spool"), probe_interval_s=3600,
        checkpoint_location=f"nofs://ck:{CHECKPOINT_PASSWORD}@b/c",
    )  # fmt: skip
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("masked", 0, "q"))
        said = "sink 'broken': no route to s3://ck:***@b/c with ***"
        assert fan.lagging.lags()["broken"].error == f"SinkUnreachableError: {said}"
    finally:
        fan.close()
    told = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert told and all(said in m for m in told), told
    assert not [m for m in told if CHECKPOINT_PASSWORD in m or OTHER_PASSWORD in m]


class _UnreachableAtOpen(ScriptedSink):
    def open(self, context: Any) -> None:
        raise SinkUnreachableError(
            f"no route to s3://ck:{CHECKPOINT_PASSWORD}@b/c with {OTHER_PASSWORD}", sink=self.name
        )


class _Unmarkable(_StoredLedger):
    """Its marks fail, the store's error naming the ledger's location."""

    def mark_committed(self, entry: LedgerEntry) -> None:
        raise OSError(f"Generic S3 error: put {self.path}/_delta_log/00001.json: timed out")


def test_a_failed_ledger_mark_raises_an_error_masked_of_the_pipelines_secrets() -> None:
    """A sink written but not marked fails its batch with the ledger's error, which was
    raised as the store said it, the ledger location's password in it."""
    ledger = _Unmarkable()
    fan = FanOut("masked", ledger, [ScriptedSink("a")], retries=0)
    try:
        with pytest.raises(BatchFailedError) as failure:
            fan.process(SchemaFrame([1, 2]), BatchInfo("masked", 0, "q"))
    finally:
        fan.close()
    said = [str(e) for e in error_chain(failure.value)]
    assert not [s for s in said if LEDGER_PASSWORD in s], said
    assert "Generic S3 error: put s3://k:***@b/ledger/_delta_log/00001.json: timed out" in said


def test_a_lag_limits_error_quotes_the_catch_ups_error_masked(tmp_path: Path) -> None:
    """Past its max_lag, a sink whose drain cannot read its batches back (the backfill
    source's table, the spool) stops the query with a LagLimitError quoting the read's
    error, which was raised as the store said it."""
    down = ScriptedSink("down", always_fail=RuntimeError("refused"))
    fan = FanOut(
        "masked", MemoryLedger(),
        [SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag", "max_lag": 1})),
         _Guarded("guarded")],
        spool=str(tmp_path / "spool"), probe_interval_s=3600, backoff_s=0,
    )  # fmt: skip

    def unreadable(sink: str, key: tuple[int, int]) -> Any:
        raise OSError(f"cannot read s3://k:{OTHER_PASSWORD}@b/origin, batch {key[1]}")

    fan.catchup._reader.read = unreadable  # type: ignore[method-assign]
    try:
        fan.process(SchemaFrame([1]), BatchInfo("masked", 0, "q"))
        with pytest.raises(LagLimitError) as stopped:
            fan.process(SchemaFrame([2]), BatchInfo("masked", 1, "q"))
    finally:
        fan.close()
    said = [str(e) for e in error_chain(stopped.value)]
    assert not [s for s in said if OTHER_PASSWORD in s], said
    assert "OSError: cannot read s3://k:***@b/origin, batch 0" in said[0]


class _ShortWord(ScriptedSink):
    """A sink whose password is a short common word."""

    def secret_values(self) -> list[str]:
        return ["batch"]


def test_another_sinks_short_password_masks_a_sinks_error_only_where_printed_text_would() -> None:
    """A password ``batch`` of one sink masked wherever it stood alone in every other
    sink's error turned the ledger's row and the raised error into "sink 'down', *** 0".
    Another sink's secrets are masked as printed text masks them (in a URL's password, or
    anywhere from 8 characters); the failing sink's own wherever they stand alone."""
    leak = RuntimeError("batch too large for u:pw9 at postgresql://u:batch@h/db")
    down = _Own("down", always_fail=leak)
    ledger = MemoryLedger()
    fan = FanOut("masked", ledger, [down, _ShortWord("short")], retries=0)
    try:
        with pytest.raises(BatchFailedError) as failure:
            fan.process(SchemaFrame([1, 2]), BatchInfo("masked", 0, "q"))
    finally:
        fan.close()
    said = (
        "SinkWriteError: sink 'down', batch 0: RuntimeError: batch too large for u:*** at "
        "postgresql://u:***@h/db"
    )
    assert [e.error for e in ledger.entries if e.status == "failed"] == [said]
    assert said.removeprefix("SinkWriteError: ") in str(failure.value)


class _Own(ScriptedSink):
    def secret_values(self) -> list[str]:
        return ["pw9"]


def test_a_ledger_unreachable_at_a_batchs_lookup_fails_the_batch_with_a_masked_ledger_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store down at the lookup (a refresh of the log): before, the batch raised the
    store's bare OSError, which names the location as written, password and all."""
    from deltalake import DeltaTable

    from fanout.errors import LedgerError

    ledger = DeltaLedger(str(tmp_path / "ledger"))
    sink = ScriptedSink("a")
    fan = FanOut("down", ledger, [sink], retries=0)
    fan.process(SchemaFrame([1]), BatchInfo("down", 0, "q"))
    ledger.path = f"s3://ck:{CHECKPOINT_PASSWORD}@b/ledger"  # as a store's error names it

    def unreachable(table: DeltaTable) -> None:
        raise OSError(f"Generic S3 error: connection refused ({ledger.path})")

    monkeypatch.setattr(DeltaTable, "update_incremental", unreachable)
    with pytest.raises(LedgerError) as raised:
        fan.process(SchemaFrame([2]), BatchInfo("down", 1, "q"))
    assert str(raised.value).startswith(
        "cannot read the ledger at s3://ck:***@b/ledger: Generic S3 error: connection refused "
        "(s3://ck:***@b/ledger); check that its store is reachable, then run again"
    )
    assert sink.calls == [(0, 1)]  # batch 1 written to no sink


def test_a_failed_ledger_compaction_is_logged_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A compaction of the ledger's small files that fails (another writer compacted
    first, the store down) is logged, not raised: the store's error, which names the
    location as written, went to the application's own handlers, which mask nothing."""
    import fanout.ledger.delta_table as delta_table

    ledger = DeltaLedger(str(tmp_path / "ledger"), compact_after_files=2)
    fan = FanOut("masked", ledger, [ScriptedSink("a")], retries=0)
    ledger.path = f"s3://k:{LEDGER_PASSWORD}@b/ledger"  # as a store's error names it

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OSError(f"Generic S3 error: put {ledger.path}/part-1.parquet: timed out")

    monkeypatch.setattr(delta_table.LedgerTable, "compaction", refused)
    try:
        for batch in (0, 1):  # two files added: compacted after the second mark
            fan.process(SchemaFrame([batch]), BatchInfo("masked", batch, "q"))
    finally:
        fan.close()
    said = [r.getMessage() for r in caplog.records if "compacting" in r.getMessage()]
    assert said and not [m for m in said if LEDGER_PASSWORD in m], said
    assert "Generic S3 error: put s3://k:***@b/ledger/part-1.parquet: timed out" in said[0]
