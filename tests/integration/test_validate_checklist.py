"""``fanout validate`` checks routes and target schemas against the declared source schema
and reports every problem in one run, as a checklist (issue 14, item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from tests.in_process_cli import Cli
from tests.integration.checklist import validate

SINKS = """[[sinks]]
type = "delta"
name = "bronze"
path = "{data}/bronze"

[[sinks]]
type = "delta"
name = "paid"
path = "{data}/paid"
where = "stauts = 'paid'"

[[sinks]]
type = "delta"
name = "cents"
path = "{data}/cents"
select = ["order_id", "amout * 100 AS cents"]

[[sinks]]
type = "delta"
name = "old"
path = "{data}/old"

[[sinks]]
type = "delta"
name = "unopened"
path = "{data}/unopened"
engine = "spark"
"""


def test_validate_reports_every_problem_as_a_checklist(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    write_deltalake(str(tmp_path / "old"), pa.table({"order_id": pa.array(["a"], pa.string())}))
    schema = "order_id LONG, status STRING, amount DOUBLE"
    validated = validate(tmp_path, schema, SINKS.format(data=tmp_path), fanout_cli)
    assert validated.code == 2
    lines = validated.lines
    verdicts = [line[:8] + line[8:].split(":")[0] for line in lines]
    assert verdicts == [
        "  OK    source",
        f"  OK    ledger {tmp_path}/ledger",
        f"  INFO  ledger {tmp_path}/ledger",
        "  OK    sink bronze",
        "  OK    sink bronze",
        "  INFO  sink bronze",
        "  OK    sink bronze",
        "  OK    sink paid",
        "  OK    sink paid",
        "  INFO  sink paid",
        "  FAIL  sink paid",
        "  OK    sink cents",
        "  OK    sink cents",
        "  INFO  sink cents",
        "  FAIL  sink cents",
        "  OK    sink old",
        "  OK    sink old",
        "  FAIL  sink old",
        "  OK    sink unopened",
        "  FAIL  sink unopened",  # and no schema check of a target that did not open
    ]
    failed = [line for line in lines if line.startswith("  FAIL")]
    assert failed[0].startswith(
        "  FAIL  sink paid: route resolves against the source schema: sink 'paid': route where "
        "\"stauts = 'paid'\" cannot be applied to the batch: [UNRESOLVED_COLUMN"
    )
    assert "`status`" in failed[0]  # Spark's suggestion
    assert failed[1].startswith(
        "  FAIL  sink cents: route resolves against the source schema: sink 'cents': route "
        "select 'amout * 100 AS cents' cannot be applied"
    )
    assert failed[2].startswith("  FAIL  sink old: target takes the routed schema: sink 'old': ")
    assert "order_id" in failed[2]
    assert failed[3].startswith("  FAIL  sink unopened: opens its target: Delta sink 'unopened'")
    assert [line for line in lines if line.startswith("  INFO")] == [
        f"  INFO  ledger {tmp_path}/ledger: would create the ledger table",
        *(f"  INFO  sink {name}: would create the Delta table at {tmp_path}/{name} (its first "
          "batch does)" for name in ("bronze", "paid", "cents")),
    ]  # fmt: skip
    assert "configuration error: 4 of 16 checks failed:" in validated.err
    assert not (tmp_path / "checkpoint").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input", "old", "pipeline.toml"]


def test_validate_masks_the_password_of_a_dead_letter_written_with_its_kind(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """A ``dead_letter`` written ``<kind>:<location>``: its location's password was no
    secret (read only where a URL begins the text), so the refusal of the kind printed it."""
    from fanout.observe.logs import secrets_apart

    password = "Dl-cli-secret-5120"
    sinks = (
        f'[[sinks]]\ntype = "delta"\nname = "d"\npath = "{tmp_path}/d"\n'
        f'dead_letter = "detla:s3://KEY:{password}@bucket/dl"\n'
    )
    with secrets_apart():  # what this run registers only
        validated = validate(tmp_path, "order_id LONG", sinks, fanout_cli)
    assert validated.code == 2
    refusal = (
        "sink 'd': dead_letter 'detla:s3://KEY:***@bucket/dl' is a detla target, but no "
        "installed plugin provides that kind (kinds: delta, kafka, postgres)"
    )
    assert f"  FAIL  sink d: opens its target: {refusal}" in validated.lines, validated.out
    assert f"  - sink d: opens its target: {refusal}" in validated.err.splitlines()
    assert password not in validated.out + validated.err
