"""Dead letters: the shared Delta target, and the Delta sink's null merge keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fanout_delta import DeltaSink

from fanout import ConfigurationError, SinkContext
from fanout.deadletters.model import DeadLetter, DeltaDeadLetters, split_target
from fanout.delta_tables.io import read_delta
from fanout.testing import make_batch


def test_target_strings() -> None:
    assert split_target("/data/dead", "s") == ("delta", "/data/dead")
    assert split_target("delta:/data/dead", "s") == ("delta", "/data/dead")
    assert split_target("s3://bucket/dead", "s") == ("delta", "s3://bucket/dead")
    assert split_target("postgres:ops.dead", "s", ("delta", "postgres")) == ("postgres", "ops.dead")
    with pytest.raises(ConfigurationError) as unsupported:
        split_target("kafka:dead-orders", "bronze")
    assert str(unsupported.value) == (
        "sink 'bronze': dead_letter 'kafka:dead-orders' is a kafka target; this sink supports "
        "delta (a Delta table path works for every sink)"
    )


def test_delta_dead_letters_are_written_once_per_batch(tmp_path: Path) -> None:
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    batch = make_batch([{"id": 1}], batch_id=7, pipeline="p", sink_name="pg")
    letters = [DeadLetter({"id": 1, "name": "x" * 3}, "value too long", "name", "xxx")]
    assert target.write(batch, letters) == 1
    assert target.write(batch, letters) == 1  # a replay
    rows = read_delta(str(tmp_path / "dead")).to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert (row["pipeline"], row["sink"], row["batch_id"]) == ("p", "pg", 7)
    assert (row["reason"], row["column"], json.loads(row["value"])) == (
        "value too long",
        "name",
        "xxx",
    )
    assert json.loads(row["row"]) == {"id": 1, "name": "xxx"}


def test_delta_merge_sends_null_keys_to_the_dead_letter_table(tmp_path: Path) -> None:
    sink = DeltaSink(
        name="latest",
        path=str(tmp_path / "t"),
        mode="merge",
        keys=["k"],
        order_by="v",
        dead_letter=str(tmp_path / "dead"),
    )
    sink.open(SinkContext("p"))
    rows = [{"k": 1, "v": 1}, {"k": None, "v": 2}, {"k": 2, "v": 3}, {"k": None, "v": 4}]
    result = sink.write(make_batch(rows, batch_id=0, pipeline="p", sink_name="latest"))
    assert (result.rows, result.dead_lettered) == (2, 2)
    table = sorted(read_delta(str(tmp_path / "t")).to_pylist(), key=lambda r: r["k"])
    assert table == [{"k": 1, "v": 1}, {"k": 2, "v": 3}]
    dead = read_delta(str(tmp_path / "dead")).to_pylist()
    assert sorted(json.loads(d["row"])["v"] for d in dead) == [2, 4]
    assert {d["reason"] for d in dead} == {"null in key column 'k': a null key cannot be merged"}
    assert {d["column"] for d in dead} == {"k"}

    replay = sink.write(make_batch(rows, batch_id=0, pipeline="p", sink_name="latest"))
    assert replay.dead_lettered == 2 and replay.already_written
    assert len(read_delta(str(tmp_path / "dead"))) == 2


def test_delta_sink_rejects_a_dead_letter_kind_it_cannot_write(tmp_path: Path) -> None:
    sink = DeltaSink(name="b", path=str(tmp_path / "t"), dead_letter="kafka:dead")
    with pytest.raises(ConfigurationError) as bad:
        sink.open(SinkContext("p"))
    assert "dead_letter 'kafka:dead' is a kafka target" in str(bad.value)
