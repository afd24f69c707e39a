"""``fanout ledger lift-fence`` refuses, lifting nothing, what no start of the epoch can
have fenced: an epoch other than the one after the pipeline's current epoch (the one a
start recorded is refused too: ``test_lift_fence_command.py``), a sink the pipeline file
does not name. Its lifts, through real sinks: plugins/fanout-kafka/tests/
test_lift_fence_command.py. No Spark: a ledger written by hand."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from fanout.app.cli import main
from fanout.app.recover_sinks import built_sink
from fanout.contract.sink import SinkContext
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry


def _pipeline(tmp_path: Path, *, epoch: int) -> Path:
    """Pipeline ``p`` of sink ``lake``, in ``epoch`` (started by query ``q1`` at batch 3)."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    now = datetime.now(UTC)
    ledger.mark_committed(LedgerEntry("p", "lake", 0, "committed", query_id="q0",
                                      started_at=now, finished_at=now))  # fmt: skip
    if epoch:
        ledger.start_epoch(LedgerEntry("p", "*", 3, "epoch", query_id="q1", epoch=epoch))
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/ck"\n'
        f'[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "lake"\n'
        f'path = "{tmp_path}/lake"\n'
    )
    return file


@pytest.mark.parametrize(("epoch", "given"), [(0, 2), (1, 3)])
def test_an_epoch_no_start_can_have_fenced_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], epoch: int, given: int
) -> None:
    file = _pipeline(tmp_path, epoch=epoch)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", str(given)]) == 2
    assert capsys.readouterr() == (
        "",
        f"fanout: configuration error: pipeline 'p': --epoch {given}: the pipeline's epoch is "
        f"{epoch}, so only a start of epoch {epoch + 1} can have fenced its sinks (the "
        "refusal of the replaced epoch's write names the epoch); nothing lifted\n",
    )
    assert not (tmp_path / "lake").exists()


def test_a_sink_the_file_does_not_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = _pipeline(tmp_path, epoch=0)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", "1",
                 "--sink", "lak"]) == 2  # fmt: skip
    assert capsys.readouterr() == (
        "",
        "fanout: configuration error: --sink lak: no sink of that name in the pipeline file "
        "(lake); check the name\n",
    )
    assert not (tmp_path / "lake").exists()


def _checkpoint_batch(tmp_path: Path, batch: int, *, age_s: float) -> None:
    """The file's checkpoint with batch ``batch`` planned ``age_s`` ago, not committed (the
    batches before it committed)."""
    for kind, batches in (("offsets", range(batch + 1)), ("commits", range(batch))):
        (tmp_path / "ck" / kind).mkdir(parents=True, exist_ok=True)
        for b in batches:
            (tmp_path / "ck" / kind / str(b)).write_text("v1\n")
    planned = time.time() - age_s
    os.utime(tmp_path / "ck" / "offsets" / str(batch), (planned, planned))


def test_a_checkpoint_with_a_batch_just_planned_is_refused_as_a_start_perhaps_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new epoch's start fences in its query's first batch, after Spark planned it
    (offsets/N) and before its ledger row: a batch planned within the last minute and not
    committed may be that start, still running. A lift then would let the replaced query
    write its batch beside the new epoch's: refused, nothing opened or lifted."""
    file = _pipeline(tmp_path, epoch=0)
    _checkpoint_batch(tmp_path, 2, age_s=5)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"fanout: configuration error: pipeline 'p': pipeline.checkpoint '{tmp_path}/ck' of "
        f"{file}: batch 2 was planned 5s ago and is not committed: a query may be running on "
        "it, a new epoch's start between its fences and its ledger row perhaps; the command "
        "cannot tell a start killed between its fences and its ledger row from one still "
        "running there (nothing records a running query): lifted under a start still "
        "running, the replaced query would write its batch beside the new epoch's (its rows "
        "twice). Stop every query of the pipeline first, the new checkpoint's too. Nothing "
        "lifted. Run this again once every query of the pipeline is stopped (a batch "
        "planned 1m ago or more is taken for a query killed)\n"
    )
    assert not (tmp_path / "lake").exists()


def test_a_killed_start_is_lifted_saying_whether_there_was_a_fence_and_creating_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A batch planned two minutes ago and not committed: taken for a start killed. The
    pipeline looks running by its ledger mark (just written): a warning, the lift done.
    The Delta sink opened as validate opens it: its missing table is not created, and it
    says it held no fence."""
    file = _pipeline(tmp_path, epoch=0)
    _checkpoint_batch(tmp_path, 0, age_s=120)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", "1"]) == 0
    out, err = capsys.readouterr()
    newest, *lines = out.splitlines()
    assert newest.startswith("pipeline 'p' looks running: its newest mark is batch 0 of epoch 0")
    assert lines == [
        "pipeline 'p', sink 'lake': no fence of epoch 1's start there: nothing lifted; not "
        f"there, and not made by this command: create the Delta table at {tmp_path}/lake (its "
        "first batch does)",
        "pipeline 'p': no sink held a fence of epoch 1's start: nothing lifted (a write of "
        "epoch 0 still refused is refused for another reason: its error says which)",
    ]
    assert err == (
        "fanout: warning: pipeline 'p' looks running: the command cannot tell a start killed "
        "between its fences and its ledger row from one still running there (nothing records "
        "a running query): lifted under a start still running, the replaced query would "
        "write its batch beside the new epoch's (its rows twice). Stop every query of the "
        "pipeline first, the new checkpoint's too\n"
    )
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    ("sink", "secret"),
    [
        ('type = "postgres"\nname = "pg"\ntable = "t"\n'
         'url = "postgresql://app:Pg5ecret@127.0.0.1:9/db"\n',
         "Pg5ecret"),
        ('type = "kafka"\nname = "events"\ntopic = "t"\nbootstrap_servers = "127.0.0.1:9"\n'
         'open_timeout_s = 2\n[sinks.producer]\n"security.protocol" = "SASL_PLAINTEXT"\n'
         '"sasl.mechanism" = "PLAIN"\n"sasl.username" = "app"\n'
         '"sasl.password" = "Ka5ecret"\n',
         "Ka5ecret"),
    ],
)  # fmt: skip
def test_a_sink_that_cannot_be_opened_fails_the_lift_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sink: str, secret: str
) -> None:
    """A server down: exit 1, naming the sink and saying to run again; its password (a
    PostgreSQL URL's, Kafka's SASL) never printed."""
    file = _pipeline(tmp_path, epoch=0)
    file.write_text(file.read_text().split("[[sinks]]")[0] + "[[sinks]]\n" + sink)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", "1"]) == 1
    out, err = capsys.readouterr()
    assert secret not in out + err
    name = sink.split('name = "')[1].split('"')[0]
    lines = err.splitlines()  # librdkafka's log lines of the connection refused between
    assert lines[0].startswith("fanout: warning: pipeline 'p' looks running: ")
    err = lines[-1] + "\n"
    assert err.startswith(
        f"fanout: FanoutError: pipeline 'p': the fence epoch 1's start left on epoch 0 could "
        f"not be lifted: sink '{name}': "
    )
    assert err.endswith(". Run the command again once the sink's target can be reached\n")


def test_an_epoch_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _pipeline(tmp_path, epoch=0)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", "0"]) == 2
    assert capsys.readouterr() == (
        "",
        "fanout: configuration error: --epoch 0: a start of epoch 1 or later fences (the "
        "epoch before it); give the epoch the refusal names\n",
    )


def test_a_start_recorded_while_the_command_lifts_is_fenced_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start the fence is of was still running (no batch planned in the file's
    checkpoint: it names another), and records epoch 1 while the command lifts: the
    command asks the ledger again after its lifts, closes epoch 0 again on each sink, and
    fails (exit 1) saying so. A real Delta table (delta-rs, no Spark)."""
    from deltalake import write_deltalake
    from fanout_delta.sink import DeltaSink

    from fanout.contract.batch import txn_app_id
    from fanout.delta_tables.io import open_table, transaction_state

    file = _pipeline(tmp_path, epoch=0)
    lake = str(tmp_path / "lake")
    write_deltalake(lake, pa.table({"id": [1]}))
    sink, _ = built_sink({"type": "delta", "name": "lake", "path": lake})
    sink.open(SinkContext("p"))
    sink.fence_earlier_epochs("p", 1)  # the start's fence
    sink.close()
    app_id = txn_app_id("p", "lake", 0)
    assert transaction_state(open_table(lake), app_id)[1] is True
    lift = DeltaSink.lift_epoch_fence

    def lift_then_start(self: DeltaSink, pipeline: str, epoch: int) -> bool | None:
        there = lift(self, pipeline, epoch)
        assert transaction_state(open_table(lake), app_id)[1] is False
        ledger = DeltaLedger(str(tmp_path / "ledger"))
        ledger.start_epoch(LedgerEntry("p", "*", 1, "epoch", query_id="q1", epoch=1))
        return there

    monkeypatch.setattr(DeltaSink, "lift_epoch_fence", lift_then_start)
    assert main(["ledger", "lift-fence", "--config", str(file), "--epoch", "1"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[1:] == []
    assert err.splitlines()[-1] == (
        "fanout: FanoutError: pipeline 'p': epoch 1 started while this command lifted its "
        "start's fences (that start was still running): closed epoch 0 again on sink 'lake'. "
        "A batch of epoch 0's query written in between may be in a sink twice (epoch 0's "
        "batch after its last mark, which epoch 1 writes again). Stop every query of the "
        "pipeline before lifting a fence"
    )
    assert transaction_state(open_table(lake), app_id)[1] is True
