"""``FanOut.check_source(df)``: a library user's pipeline is refused before its stream
starts for the mistakes ``fanout run`` refuses before it starts the query, with the same
text, made by the same code (``fanout run`` calls the method): a misspelt key column, a
route ``select`` or ``where`` that does not resolve, a target that cannot take the routed
schema, a key computed with ``rand()`` in the source. Before, the library found each at
batch 0, after the query had started and the other sinks had written the batch; and
``fanout run`` found none of the last kind before its first batch either.

Each case is run through both entry points on the same file: ``fanout run`` (the CLI's
``main``, in this process, on the session's Spark) and ``FanOut(...)`` +
``check_source``. A good pipeline passes and writes nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError, FanOut
from fanout.app import runner
from fanout.hooks import registry as registry_module
from tests.in_process_cli import Cli
from tests.integration.streams import delta_rows, pipeline_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import partitioned_sink as partitioned_example

SCHEMA = "order_id LONG, amount DOUBLE"
BRONZE = '[[sinks]]\ntype = "delta"\nname = "bronze"\npath = "{d}/bronze"\n'
LATEST = '\n[[sinks]]\ntype = "delta"\nname = "latest"\npath = "{d}/latest"\nmode = "merge"\n'
HINT = "; nothing started (`fanout validate {file}` runs every check):"
UNRESOLVED = (
    "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name "
    "`amout` cannot be resolved. Did you mean one of the following? [`amount`, `order_id`]. "
    "SQLSTATE: 42703; line 1 pos 0"
)
FIX = "; fix the sink's '{}' against the batch's columns, or add to the stream what it names"

# each mistake: the sinks after bronze (TOML), the source's transform, the lines after
# the header; {d} is the test's directory
MISTAKES: dict[str, tuple[str, str | None, list[str]]] = {
    "misspelt key": (
        LATEST + 'keys = ["orderid"]\n',
        None,
        [
            "  - sink 'latest': option 'keys' names column(s) 'orderid' not in the batch (the "
            "batch's columns: order_id, amount); fix the option or add the column(s) to the "
            "stream"
        ],
    ),
    "select of a missing column": (
        '\n[[sinks]]\ntype = "delta"\nname = "slim"\npath = "{d}/slim"\n'
        'select = ["order_id", "amout * 100 AS cents"]\n',
        None,
        [
            "  - sink 'slim': route select 'amout * 100 AS cents' cannot be applied to the "
            f"batch: {UNRESOLVED}{FIX.format('select')}"
        ],
    ),
    "where that does not resolve": (
        '\n[[sinks]]\ntype = "delta"\nname = "big"\npath = "{d}/big"\nwhere = "amout > 10"\n',
        None,
        [
            f"  - sink 'big': route where 'amout > 10' cannot be applied to the batch: {UNRESOLVED}"
            + FIX.format("where")
        ],
    ),
    "target cannot take the schema": (
        LATEST + 'keys = ["order_id"]\n',
        None,
        [  # the table exists (the test writes it), its amount a string
            "  - sink 'latest': the batch does not fit the Delta table: type conflict in "
            "column(s) 'amount' (table string, batch double); cast them in the stream to the "
            "table's types (delta-rs would cast lossily or fail)"
        ],
    ),
    "non-deterministic key": (
        '\n[[sinks]]\ntype = "partitioned_files"\nname = "files"\ndirectory = "{d}/files"\n'
        'key = "order_id"\n',
        "SELECT CAST(rand() * 1000 AS BIGINT) AS order_id, amount FROM source",
        [
            "  - sink 'files': the source's column 'order_id' (CAST((rand() * CAST(1000 AS "
            "DOUBLE)) AS BIGINT) AS order_id) is not deterministic: a replay or retry would put "
            "rows in other partitions than the attempt that committed some of them (rows lost "
            "and duplicated). This sink partitions by order_id: derive those columns "
            "deterministically from the input (its other columns may be non-deterministic)"
        ],
    ),
    "key from the clock": (
        '\n[[sinks]]\ntype = "partitioned_files"\nname = "files"\ndirectory = "{d}/files"\n'
        'key = "yr"\n',
        "SELECT order_id, amount, year(current_timestamp()) AS yr FROM source",
        [  # batch 0 refuses it too: the query's current_batch_timestamp() is non-deterministic
            "  - sink 'files': the source's column 'yr' (current_timestamp()) is not "
            "deterministic: a replay or retry would put rows in other partitions than the "
            "attempt that committed some of them (rows lost and duplicated). This sink "
            "partitions by yr: derive those columns deterministically from the input (its "
            "other columns may be non-deterministic)"
        ],
    ),
}


@pytest.fixture
def partitioned_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's ``partitioned_files`` sink type installed, as a plugin would be."""
    load = registry_module.load_registry

    def with_example(extra: Any = (), **kwargs: Any) -> Any:
        return load([partitioned_example, *extra], **kwargs)

    monkeypatch.setattr(registry_module, "load_registry", with_example)
    monkeypatch.setattr(runner, "load_registry", with_example)
    monkeypatch.setattr("fanout.fan_out.load_registry", with_example)


def _file(d: Path, sinks: str, transform: str | None) -> Path:
    (d / "input").mkdir()
    (d / "input" / "a.json").write_text('{"order_id": 7, "amount": 1.0}\n')
    text = pipeline_file(d, "orders", SCHEMA, (BRONZE + sinks).format(d=d), available_now=True)
    if transform is not None:
        schema = f'schema = "{SCHEMA}"\n'
        text = text.replace(schema, f'{schema}transform = "{transform}"\n')
    file = d / "pipeline.toml"
    file.write_text(text)
    return file


def _refusal(spark: Any, file: Path, entry: str, fanout_cli: Cli) -> str:
    """What ``entry`` says of the pipeline file: ``fanout run``'s error (after its
    ``fanout: configuration error: ``), or the error ``check_source`` raises."""
    if entry == "fanout run":
        ran = fanout_cli("run", file)
        assert ran.returncode == 2
        out, err = ran.stdout, ran.stderr
        assert out == "", out
        assert err.startswith("fanout: configuration error: "), err  # no Spark trace before
        return err.removeprefix("fanout: configuration error: ").rstrip("\n")
    config = runner.load_pipeline(str(file))
    df = runner.build_source(spark, config)
    with FanOut(config.name, config.ledger, config.sinks, spark=spark, retries=0,
                checkpoint_location=config.checkpoint, pipeline_file=str(file)) as fan:  # fmt: skip
        with pytest.raises(ConfigurationError) as refused:
            fan.check_source(df)
    return str(refused.value)


@pytest.mark.parametrize("entry", ["fanout run", "FanOut.check_source"])
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_refused_before_the_stream_starts_with_the_runs_text(
    spark: Any,
    tmp_path: Path,
    fanout_cli: Cli,
    partitioned_files: None,
    mistake: str,
    entry: str,
) -> None:
    sinks, transform, lines = MISTAKES[mistake]
    file = _file(tmp_path, sinks, transform)
    if mistake == "target cannot take the schema":
        import pyarrow as pa
        from deltalake import write_deltalake

        held = pa.table({"order_id": pa.array([1], pa.int64()), "amount": pa.array(["one"])})
        write_deltalake(str(tmp_path / "latest"), held)
    text = _refusal(spark, file, entry, fanout_cli)
    header = "1 sink(s) cannot take the source's rows" + HINT.format(file=file)
    assert text.splitlines() == [header, *lines], text
    # nothing started: no checkpoint, no batch written, no ledger row (FanOut(...) created
    # the ledger, empty)
    assert not (tmp_path / "checkpoint").exists()
    assert not (tmp_path / "bronze").exists()
    assert delta_rows(tmp_path / "ledger") == []
    if mistake == "target cannot take the schema":
        assert delta_rows(tmp_path / "latest") == [{"order_id": 1, "amount": "one"}]


def test_a_good_pipeline_passes_and_writes_nothing(spark: Any, tmp_path: Path) -> None:
    """Routed and keyed sinks that fit the source: ``check_source`` returns, and nothing
    is written (no sink's table, no checkpoint, no ledger mark)."""
    sinks = (
        LATEST + 'keys = ["order_id"]\n'
        '\n[[sinks]]\ntype = "delta"\nname = "big"\npath = "{d}/big"\nwhere = "amount > 10"\n'
        'select = ["order_id", "amount * 100 AS cents"]\n'
    )
    file = _file(tmp_path, sinks, None)
    config = runner.load_pipeline(str(file))
    df = runner.build_source(spark, config)
    with FanOut(config.name, config.ledger, config.sinks, spark=spark,
                checkpoint_location=config.checkpoint) as fan:  # fmt: skip
        assert fan.check_source(df) is None
    # no sink's table, no checkpoint; the ledger FanOut(...) created holds no row
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input", "ledger", "pipeline.toml"]
    assert delta_rows(tmp_path / "ledger") == []


def test_a_fan_out_built_in_python_says_the_same_without_a_file(spark: Any, tmp_path: Path) -> None:
    """Without ``pipeline_file`` the message has no ``fanout validate`` to name; its lines
    are the same. A static DataFrame of the source's columns is checked as the stream."""
    df = spark.createDataFrame([(7, 1.0)], SCHEMA)
    sinks = [
        {"type": "delta", "name": "latest", "path": str(tmp_path / "latest"), "mode": "merge",
         "keys": ["orderid"]},
        {"type": "delta", "name": "big", "path": str(tmp_path / "big"), "where": "amout > 10"},
    ]  # fmt: skip
    with FanOut("orders", str(tmp_path / "ledger"), sinks, spark=spark) as fan:
        with pytest.raises(ConfigurationError) as refused:
            fan.check_source(df)
    assert str(refused.value).splitlines() == [
        "2 sink(s) cannot take the source's rows; nothing started:",
        MISTAKES["misspelt key"][2][0],
        MISTAKES["where that does not resolve"][2][0],
    ]
    assert not (tmp_path / "latest").exists() and not (tmp_path / "big").exists()


def test_volatile_columns_the_sink_does_not_need_stable_pass_and_the_run_writes(
    spark: Any,
    tmp_path: Path,
    fanout_cli: Cli,
    partitioned_files: None,
) -> None:
    """The source-plan determinism check follows only the columns the sink needs stable,
    as batch 0 does: a partitioned sink keyed by a deterministic column, its source
    computing other columns with ``uuid()`` and ``rand()`` (no filter), passes
    ``check_source``, and ``fanout run`` starts and writes its row (as on ee3a8e9)."""
    from pyspark import cloudpickle

    sinks = (
        '\n[[sinks]]\ntype = "partitioned_files"\nname = "files"\n'
        'directory = "{d}/files"\nkey = "order_id"\n'
    )
    transform = "SELECT order_id, amount, uuid() AS trace, rand() AS score FROM source"
    file = _file(tmp_path, sinks, transform)
    config = runner.load_pipeline(str(file))
    df = runner.build_source(spark, config)
    with FanOut(config.name, config.ledger, config.sinks, spark=spark,
                checkpoint_location=config.checkpoint) as fan:  # fmt: skip
        assert fan.check_source(df) is None
    cloudpickle.register_pickle_by_value(partitioned_example)  # the executors lack examples/
    try:
        ran = fanout_cli("run", file)
        assert ran.returncode == 0, ran.stderr
    finally:
        cloudpickle.unregister_pickle_by_value(partitioned_example)
    written = [
        json.loads(line)
        for path in sorted((tmp_path / "files").glob("*.jsonl"))
        for line in path.read_text().splitlines()[1:]  # the first line: the commit's mark
    ]
    assert [(row["order_id"], row["amount"]) for row in written] == [(7, 1.0)], written
    assert [(r["order_id"], r["amount"]) for r in delta_rows(tmp_path / "bronze")] == [(7, 1.0)]
