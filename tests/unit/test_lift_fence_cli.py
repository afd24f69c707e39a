"""``fanout ledger lift-fence`` refuses, lifting nothing, what no start of the epoch can
have fenced: an epoch other than the one after the pipeline's current epoch (the one a
start recorded is refused too: ``test_lift_fence_command.py``), a sink the pipeline file
does not name. Its lifts, through real sinks: plugins/fanout-kafka/tests/
test_lift_fence_command.py. No Spark: a ledger written by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry


def _pipeline(tmp_path: Path, *, epoch: int) -> Path:
    """Pipeline ``p`` of sink ``lake``, in ``epoch`` (started by query ``q1`` at batch 3)."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    ledger.mark_committed(LedgerEntry("p", "lake", 0, "committed", query_id="q0"))
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
