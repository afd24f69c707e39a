"""``fanout ledger lift-fence`` on a PostgreSQL sink whose table was dropped after a new
epoch's start fenced it and was killed: the command lifts the fence (its record deleted,
and it says there was one) and creates nothing: the sink is opened as ``fanout validate``
opens it, so the dropped table is not made again (empty, it would hide its loss from the
next run's lost-target check) nor the state migrated. Run again, it says there is no
fence left. Real PostgreSQL, a Delta ledger written by hand, the command in its own
process."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from fanout.app.recover_sinks import built_sink
from fanout.contract.sink import SinkContext
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from tests.cli_process import fanout_process

pytestmark = pytest.mark.integration


def _toml(value: object) -> str:
    return "true" if value is True else f'"{value}"'


def test_lift_fence_lifts_a_postgres_fence_and_does_not_create_its_dropped_table(
    pg_url: str, tmp_path: Path
) -> None:
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (id bigint)"))
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    ledger.mark_committed(LedgerEntry("p", "pg", 0, "committed", query_id="q0",
                                      started_at=long_ago, finished_at=long_ago))  # fmt: skip
    options = {"type": "postgres", "name": "pg", "url": pg_url, "table": "orders",
               "mode": "append", "create_table": True}  # fmt: skip
    sink, _ = built_sink(options)
    sink.open(SinkContext("p"))  # as a start of epoch 1 killed after its fence
    try:
        sink.fence_earlier_epochs("p", 1)
    finally:
        sink.close()
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE orders"))
        fences = "SELECT count(*) FROM fanout.progress WHERE pipeline = 'p' AND partition = -1"
        assert conn.execute(sa.text(fences)).scalar() == 1
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/ck"\n'
        '[source]\nformat = "rate"\n[[sinks]]\n'
        + "".join(f"{k} = {_toml(v)}\n" for k, v in options.items())
    )

    said = "pipeline 'p', sink 'pg': "
    lifted = fanout_process("ledger", "lift-fence", "--config", str(file), "--epoch", "1")
    assert (lifted.returncode, lifted.stderr) == (0, ""), lifted
    newest, *lines = lifted.stdout.splitlines()
    assert newest.startswith("pipeline 'p' looks stopped: its newest mark is batch 0 of epoch 0")
    missing = "create table orders (at the first batch, from its columns)"
    assert lines == [
        f"{said}the fence epoch 1's start left on epoch 0 lifted: epoch 0 open to its writes "
        f"again; not there, and not made by this command: {missing}",
        "pipeline 'p': epoch 0's checkpoint can run again: restart the query on it (the one "
        "whose write was refused) to complete its batch",
    ]
    with engine.begin() as conn:
        assert conn.execute(sa.text(fences)).scalar() == 0
        assert sa.inspect(conn).has_table("orders") is False

    again = fanout_process("ledger", "lift-fence", "--config", str(file), "--epoch", "1")
    assert again.returncode == 0, again
    assert again.stdout.splitlines()[1:] == [
        (
            f"{said}no fence of epoch 1's start there: nothing lifted; not there, and not made "
            f"by this command: {missing}"
        ),
        "pipeline 'p': no sink held a fence of epoch 1's start: nothing lifted (a write of "
        "epoch 0 still refused is refused for another reason: its error says which)",
    ]
    engine.dispose()
