"""A real stream into three Delta sinks: exact contents in every sink and in the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from fanout import FanOut
from fanout.contract.batch import txn_app_id
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    order,
    run_stream,
    write_input,
)

FILES, ROWS = 5, 40


def test_three_sinks_hold_exactly_the_input(spark: Any, tmp_path: Path) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    fan = FanOut(
        "e2e",
        str(tmp_path / "ledger"),
        [
            {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")},
            {
                "type": "delta",
                "name": "latest",
                "path": str(tmp_path / "latest"),
                "mode": "merge",
                "keys": ["customer"],
                "order_by": "order_id",
            },
            {
                "type": "delta",
                "name": "by_status",
                "path": str(tmp_path / "by_status"),
                "partition_by": ["status"],
            },
        ],
    )
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    expected_ids = {r["order_id"] for r in rows}
    for sink in ("bronze", "by_status"):
        counts = id_counts(delta_rows(tmp_path / sink))
        assert set(counts) == expected_ids, sink
        assert set(counts.values()) == {1}, f"{sink} holds duplicates"
    assert sorted(delta_rows(tmp_path / "bronze"), key=lambda r: r["order_id"]) == rows

    latest_rows = delta_rows(tmp_path / "latest")
    latest = {r["customer"]: r for r in latest_rows}
    assert len(latest_rows) == len(latest) == 7
    winners = {}
    for r in rows:
        winners[r["customer"]] = r  # ids grow, so the last row of a customer wins
    assert latest == winners
    assert DeltaTable(str(tmp_path / "by_status")).metadata().partition_columns == ["status"]

    marks = committed_marks(tmp_path / "ledger", "e2e")
    assert marks == {(s, b): 1 for s in ("bronze", "latest", "by_status") for b in range(FILES)}
    bronze = DeltaTable(str(tmp_path / "bronze"))
    assert bronze.transaction_version(txn_app_id("e2e", "bronze")) == FILES - 1
    ledger = delta_rows(tmp_path / "ledger")
    committed = [r for r in ledger if r["sink"] == "bronze"]
    assert sorted(r["rows"] for r in committed) == [ROWS] * FILES
    assert all(r["query_id"] for r in ledger)
    offsets = sorted({r["source_offsets"] for r in committed})
    assert offsets == sorted(f'[{{"logOffset": {b}}}]' for b in range(FILES))
    assert order(0) in rows


def test_routed_sinks_get_exactly_their_subsets(spark: Any, tmp_path: Path) -> None:
    rows = write_input(tmp_path / "input", 3, ROWS)
    fan = FanOut(
        "routed",
        str(tmp_path / "ledger"),
        [
            {
                "type": "delta",
                "name": "shipped",
                "path": str(tmp_path / "shipped"),
                "where": "status = 'shipped'",
            },
            {
                "type": "delta",
                "name": "big",
                "path": str(tmp_path / "big"),
                "where": "amount >= 50",
                "select": ["order_id", "upper(customer) AS customer"],
            },
        ],
    )
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    shipped = sorted(delta_rows(tmp_path / "shipped"), key=lambda r: r["order_id"])
    assert shipped == [r for r in rows if r["status"] == "shipped"]
    big = sorted(delta_rows(tmp_path / "big"), key=lambda r: r["order_id"])
    assert big == [
        {"order_id": r["order_id"], "customer": r["customer"].upper()}
        for r in rows
        if r["amount"] >= 50
    ]
    ledger = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"]
    rows_by_sink = {s: sum(r["rows"] for r in ledger if r["sink"] == s) for s in ("shipped", "big")}
    assert rows_by_sink == {"shipped": len(shipped), "big": len(big)}


def test_a_checkpoint_path_with_a_space_keeps_the_source_offsets(
    spark: Any, tmp_path: Path
) -> None:
    # Spark resolves the checkpoint to file:/.../my checkpoint 100%20, unescaped (Hadoop's
    # Path): fanout reads its offsets there as named (without them the ledger records none
    # and the checkpoint guard cannot tell a crash replay from a rolled-back checkpoint)
    rows = write_input(tmp_path / "input", 2, 10)
    lake = tmp_path / "my lake"
    fan = FanOut("spaced", str(tmp_path / "ledger"),
                 [{"type": "delta", "name": "bronze", "path": str(lake / "bronze")}])  # fmt: skip
    run_stream(spark, tmp_path / "input", fan, tmp_path / "my checkpoint 100%20")
    assert sorted(delta_rows(lake / "bronze"), key=lambda r: r["order_id"]) == rows
    committed = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"]
    assert sorted(r["source_offsets"] for r in committed) == [
        f'[{{"logOffset": {b}}}]' for b in range(2)
    ]
