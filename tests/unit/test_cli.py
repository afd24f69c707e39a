"""The ``fanout`` command on a real (delta-rs) ledger; no Spark needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.contract.batch import txn_app_id
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc


def _ledger(path: Path) -> DeltaLedger:
    ledger = DeltaLedger(str(path))
    ledger.open()
    for batch in range(3):
        for sink, rows in (("bronze", 10), ("latest", 4)):
            ledger.mark_committed(
                LedgerEntry(
                    "orders",
                    sink,
                    batch,
                    "committed",
                    query_id="q1",
                    rows=rows + batch,
                    finished_at=now_utc(),
                )
            )
    ledger.record_failure(
        LedgerEntry("orders", "latest", 3, "failed", query_id="q1", error="SinkWriteError: boom")
    )
    ledger.mark_committed(
        LedgerEntry("other", "x", 0, "committed", query_id="q2", rows=1, dead_lettered=3)
    )
    return ledger


def test_plugins_lists_the_delta_sink_with_its_distribution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plugins", "--json"]) == 0
    listed = {p["type"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["delta"]["distribution"] == "fanout-delta"
    assert listed["delta"]["guarantees"] == ["transactional"]
    assert listed["delta"]["version"] == "0.1.0"


DELTA_HOOKS = (
    "read_only_check, check_schema, batch_partitioning (engine=rs, mode=append, executors "
    "write), shares_tasks (engine=rs, mode=append, executors write), backfill_source "
    "(mode=append), holds_batch, holds_batch_of, fence_earlier_epochs, lift_epoch_fence, "
    "records_gone (mode=append), harmless_rewrite (mode=merge, no dead_letter), "
    "remove_batch_hint, standing_problems, secret_values, is_transient"
)
KAFKA_HOOKS = (
    "read_only_check, check_replay, check_schema, partitioned_by, "
    "batch_partitioning, shares_tasks, holds_batch, holds_batch_of, fence_earlier_epochs, "
    "lift_epoch_fence, target_replaced, records_gone, exclusive_resources, secret_values, "
    "is_transient"
)
POSTGRES_HOOKS = (
    "read_only_check, check_replay, check_schema, partitioned_by (mode=append), "
    "deterministic_columns, batch_partitioning, shares_tasks, holds_batch, holds_batch_of, "
    "fence_earlier_epochs, lift_epoch_fence, target_replaced, records_gone, harmless_rewrite "
    "(mode=upsert, no dead_letter), secret_values, is_transient"
)


def _names(hooks: str) -> list[str]:
    """The hook names of an ``implements:`` text, without the conditions."""
    return [h for h in re.sub(r" \([^)]*\)", "", hooks).split(", ")]


def test_plugins_names_the_optional_hooks_each_sink_type_implements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What a reset or a replay does with a sink depends on its optional hooks
    (``holds_batch``, ``harmless_rewrite``, ``check_replay``...): ``fanout plugins`` did not
    say which a type implements."""
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        f"delta implements: {DELTA_HOOKS}",
        f"kafka implements: {KAFKA_HOOKS}",
        f"postgres implements: {POSTGRES_HOOKS}",
    ]
    assert main(["plugins", "--json"]) == 0
    listed = {
        p["type"]: (p["implements"], p["conditions"]) for p in json.loads(capsys.readouterr().out)
    }
    assert listed == {
        "delta": (
            _names(DELTA_HOOKS),
            {
                "batch_partitioning": "engine=rs, mode=append, executors write",
                "shares_tasks": "engine=rs, mode=append, executors write",
                "backfill_source": "mode=append",
                "records_gone": "mode=append",
                "harmless_rewrite": "mode=merge, no dead_letter",
            },
        ),
        "kafka": (_names(KAFKA_HOOKS), {}),
        "postgres": (
            _names(POSTGRES_HOOKS),
            {"partitioned_by": "mode=append", "harmless_rewrite": "mode=upsert, no dead_letter"},
        ),
    }
    assert main(["plugins", "--options", "postgres"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"implements: {POSTGRES_HOOKS}"


def test_a_sink_type_implementing_no_optional_hook_says_none() -> None:
    from fanout import Sink
    from fanout.app.commands.plugins import _implements

    class Plain(Sink):
        def write(self, batch: object) -> int:
            return 0

    assert _implements(Plain) == "implements: none"


def test_status_per_sink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _ledger(tmp_path / "ledger")
    assert (
        main(["status", "--ledger", str(tmp_path / "ledger"), "--pipeline", "orders", "--json"])
        == 0
    )
    status = {s["sink"]: s for s in json.loads(capsys.readouterr().out)}
    assert sorted(status) == ["bronze", "latest"]
    assert status["bronze"]["last_committed_batch"] == 2
    assert status["bronze"]["last_batch_rows"] == 12
    assert status["bronze"]["rows_total"] == 10 + 11 + 12
    assert status["bronze"]["failed_attempts"] == 0
    assert status["latest"]["failed_attempts"] == 1
    assert status["latest"]["last_error"] == "SinkWriteError: boom"
    assert status["latest"]["last_commit_at"] is not None
    assert status["bronze"]["dead_lettered_total"] == 0

    assert main(["status", "--ledger", str(tmp_path / "ledger"), "--wide"]) == 0
    table = capsys.readouterr().out
    assert "orders    bronze  live" in table and "other     x       live" in table
    assert "dead letters" in table
    assert (
        main(["status", "--ledger", str(tmp_path / "ledger"), "--pipeline", "other", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)[0]["dead_lettered_total"] == 3


def test_status_of_a_missing_ledger_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--ledger", str(tmp_path / "nowhere")]) == 2
    assert f"no ledger at {tmp_path}/nowhere: " in capsys.readouterr().err


def test_ledger_maintain_compacts_and_keeps_lookups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _ledger(tmp_path / "ledger")
    assert (
        main(["ledger", "maintain", "--ledger", str(tmp_path / "ledger"), "--retention-hours", "0"])
        == 0
    )
    out = capsys.readouterr().out
    assert "compacted" in out and "log checkpoint written" in out
    from deltalake import DeltaTable

    table = DeltaTable(str(tmp_path / "ledger"))
    assert len(table.file_uris()) == 2  # one file per pipeline partition
    assert table.transaction_version(txn_app_id("orders", "bronze")) == 2


def test_a_negative_retention_is_refused_by_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """delta-rs' ValueError ("The retention periods should be positive.") went through as
    a traceback, exit 1, after the compaction and the log checkpoint had run."""
    _ledger(tmp_path / "ledger")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(
            ["ledger", "maintain", "--ledger", str(tmp_path / "ledger"), "--retention-hours", "-1"]
        )
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(
        "fanout ledger maintain: error: argument --retention-hours: must be 0 or more hours, "
        "not '-1'\n"
    )


def test_configuration_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--batches", "2"]) == 2
    err = capsys.readouterr().err
    assert "configuration error: --batches must be at least 5" in err


def test_errors_printed_to_stderr_have_the_registered_secrets_masked() -> None:
    from fanout.app.cli import _masked
    from fanout.app.runner import _summary
    from fanout.errors import ConfigurationError
    from fanout.observe.logs import register_secrets

    register_secrets(["Cl1-S3cret"])
    error = ConfigurationError("sink 'pg': cannot open: password Cl1-S3cret refused")
    assert _masked(error) == "sink 'pg': cannot open: password *** refused"
    assert _summary(RuntimeError("source failed at Cl1-S3cret@host\ntrace")) == (
        "source failed at ***@host"
    )


def test_a_run_failing_outside_a_batch_ends_with_fanouts_own_error_whole() -> None:
    """A deleted checkpoint: `fanout run` printed `An exception was raised by the Python
    Proxy. Return Message: Traceback (most recent call last):` (Spark's first line) and
    left the CheckpointResetError, its sinks and its ways on, in the trace file only."""
    from fanout.app.runner import _summary

    error = RuntimeError("unused")
    error.desc = (  # type: ignore[attr-defined]  # as pyspark's StreamingQueryException has it
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
        'call last):\n  File "/x/fanout/steps/guard.py", line 106, in check\n'
        "    raise CheckpointResetError(\n"
        "fanout.errors.CheckpointResetError: pipeline 'clicks': checkpoint reset detected.\n"
        "How to proceed:\n  1. Restore the original checkpoint directory.\n\n"
        "=== Streaming Query ===\nIdentifier: clicks [id = 7e4f]\n"
    )
    assert _summary(error) == (
        "pipeline 'clicks': checkpoint reset detected.\n"
        "How to proceed:\n  1. Restore the original checkpoint directory."
    )


def test_a_run_summary_of_fanouts_error_chained_to_another_holds_no_trace() -> None:
    """fanout's error was not the query's last (another was raised while it was handled):
    the summary printed, after its message, the whole trace of the other one."""
    from fanout.app.runner import _summary

    error = RuntimeError("unused")
    error.desc = (  # type: ignore[attr-defined]  # as pyspark's StreamingQueryException has it
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
        'call last):\n  File "/x/fanout/steps/guard.py", line 106, in check\n'
        "    raise CheckpointResetError(\n"
        "fanout.errors.CheckpointResetError: pipeline 'clicks': checkpoint reset detected.\n"
        "How to proceed:\n  1. Restore the original checkpoint directory.\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "/x/fanout/fan_out.py", line 9, in f\n'
        "    close()\nValueError: I/O operation on closed file\n\n"
        "=== Streaming Query ===\nIdentifier: clicks [id = 7e4f]\n"
    )
    assert _summary(error) == (
        "pipeline 'clicks': checkpoint reset detected.\n"
        "How to proceed:\n  1. Restore the original checkpoint directory."
    )


@pytest.mark.parametrize(
    ("sink_type", "options", "answers"),
    [
        ("postgres", {"mode": "upsert", "keys": "id"}, True),
        ("postgres", {"mode": "append"}, False),
        ("postgres", {"mode": "upsert", "keys": "id", "dead_letter": "postgres"}, False),
        ("delta", {"mode": "merge", "keys": ["id"]}, True),
        ("delta", {"mode": "append"}, False),
        ("delta", {"mode": "merge", "keys": ["id"], "dead_letter": "/dl"}, False),
    ],
)
def test_a_hook_listed_with_options_answers_under_them_only(
    sink_type: str, options: dict[str, object], answers: bool
) -> None:
    """``fanout plugins`` said PostgreSQL implements ``harmless_rewrite`` also in append
    mode, where it answers ``None``: a user deciding what a reset does read it wrong. A
    hook answering only under some options is listed with them, and they are the truth."""
    from fanout.hooks.registry import load_registry

    sink_class = load_registry().sink_types()[sink_type].sink_class
    condition = sink_class.hook_conditions["harmless_rewrite"]
    sink = sink_class("s", **options)
    said = [f"{k}={v}" for k, v in options.items() if k == "mode"]
    said += ["no dead_letter"] if "dead_letter" not in options else []
    assert (condition == ", ".join(said)) is answers
    assert (sink.harmless_rewrite() is not None) is answers


@pytest.mark.parametrize(
    ("sink_type", "options", "hook", "answer"),
    [
        ("delta", {"mode": "merge", "keys": ["id"], "path": "/t"}, "backfill_source", None),
        ("delta", {"mode": "append", "path": "/t", "engine": "spark"}, "shares_tasks", False),
        ("delta", {"mode": "merge", "keys": ["id"], "path": "/t"}, "shares_tasks", False),
        ("postgres", {"mode": "upsert", "keys": "id"}, "partitioned_by", None),
    ],
)
def test_every_hook_a_built_in_type_answers_only_under_some_options_says_which(
    sink_type: str, options: dict[str, object], hook: str, answer: object
) -> None:
    """``hook_conditions`` held only ``harmless_rewrite``: ``fanout plugins`` listed Delta's
    ``backfill_source`` (append only: a merge table cannot serve a ``backfill_from``),
    its task sharing (a delta-rs append only) and PostgreSQL's ``partitioned_by`` (append
    only) as answering whatever the options."""
    from fanout.hooks.registry import load_registry

    sink_class = load_registry().sink_types()[sink_type].sink_class
    sink = sink_class("s", **options)
    said = getattr(sink, hook)("p") if hook == "backfill_source" else getattr(sink, hook)()
    assert said == answer
    assert hook in sink_class.hook_conditions
