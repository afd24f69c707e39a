"""Rows failing a sink's route (a malformed CAST under ANSI mode) go to the sink's
dead-letter target; the others land; the ledger mark and `fanout status` count them; a
replay duplicates nothing. Without a target the batch fails naming sink, batch and
expression."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, BatchInfo, FanOut, RouteError
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import RecordingSink
from fanout.testing.faults import MarkLost
from tests.in_process_cli import Cli
from tests.integration.streams import EPOCH, delta_rows, run_stream

SCHEMA = "id LONG, amount STRING, qty STRING"
BAD_AMOUNT = {5: "abc", 22: "12x"}  # fail the where
BAD_QTY = {30: "q"}  # pass the where, fail the select
BAD = sorted([*BAD_AMOUNT, *BAD_QTY])
WHERE = "CAST(amount AS INT) >= 0"
SELECT = ["id", "CAST(qty AS INT) AS qty"]
CAST = '[CAST_INVALID_INPUT] The value \'{}\' of the type "STRING" cannot be cast to "INT"'


def _rows() -> list[dict[str, Any]]:
    return [
        {"id": i, "amount": BAD_AMOUNT.get(i, str(i)), "qty": BAD_QTY.get(i, str(i % 7))}
        for i in range(40)
    ]


GOOD = [{"id": i, "qty": i % 7} for i in range(40) if i not in BAD]


class FrameSink(RecordingSink):
    """A third-party sink reading the DataFrame, with a Delta ``dead_letter`` option: the
    base class's ``route_dead_letters`` serves it."""

    def __init__(self, name: str, *, dead_letter: str | None = None) -> None:
        super().__init__(name, reads="dataframe")
        self.dead_letter = dead_letter


def _sinks(tmp_path: Path, frame: FrameSink, *, dead_letter: bool = True) -> list[Any]:
    routed: dict[str, Any] = {
        "type": "delta", "name": "routed", "path": str(tmp_path / "routed"),
        "where": WHERE, "select": SELECT,
    }  # fmt: skip
    if dead_letter:
        routed["dead_letter"] = str(tmp_path / "dead")
    return [
        routed,
        SinkSpec(frame, Route(where=WHERE, select=tuple(SELECT))),  # shares the route
        {"type": "delta", "name": "all", "path": str(tmp_path / "all")},
    ]


def _by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


def _marks(ledger: Path) -> dict[str, tuple[int, int]]:
    return {
        r["sink"]: (r["rows"], r["dead_lettered"])
        for r in delta_rows(ledger)
        if r["status"] == "committed"
    }


def _check_dead_letters(path: Path, sink: str) -> None:
    dead = sorted(delta_rows(path), key=lambda r: json.loads(r["row"])["id"])
    rows = {r["id"]: r for r in _rows()}
    assert [json.loads(d["row"]) for d in dead] == [rows[i] for i in BAD]
    assert [(d["pipeline"], d["sink"], d["batch_id"]) for d in dead] == [("rd", sink, 3)] * 3
    assert [(d["column"], json.loads(d["value"])) for d in dead] == [
        (None, "abc"),
        (None, "12x"),
        ("qty", "q"),
    ]
    where, select = f"route where {WHERE!r} failed: ", f"route select {SELECT[1]!r} failed: "
    assert dead[0]["reason"].startswith(where + CAST.format("abc"))
    assert dead[1]["reason"].startswith(where + CAST.format("12x"))
    assert dead[2]["reason"].startswith(select + CAST.format("q"))


def test_rows_failing_a_route_go_to_the_dead_letter_table_once(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    batch = spark.createDataFrame(_rows(), SCHEMA)
    info = BatchInfo("rd", 3, "q")
    frame = FrameSink("frame", dead_letter=str(tmp_path / "dead-frame"))
    ledger = MarkLost(str(tmp_path / "ledger"), "routed")
    lost = FanOut("rd", ledger, _sinks(tmp_path, frame), retries=0)
    with pytest.raises(BatchFailedError) as crash:
        lost.process(batch, info)
    assert set(crash.value.failures) == {"routed"}
    assert _by_id(delta_rows(tmp_path / "routed")) == GOOD  # written with its letters
    assert len(delta_rows(tmp_path / "dead")) == 3
    lost.close()  # that driver is gone: the frame sink object serves the next FanOut

    # the replay: a new driver, the same batch; the ledger has no mark of "routed"
    fan = FanOut("rd", str(tmp_path / "ledger"), _sinks(tmp_path, frame))
    results = fan.process(batch, info)
    assert set(results) == {"routed"}
    assert results["routed"].already_written is True
    assert results["routed"].dead_lettered == 3

    assert _by_id(delta_rows(tmp_path / "routed")) == GOOD  # no duplicate
    assert _by_id(frame.rows()) == GOOD
    assert _by_id(delta_rows(tmp_path / "all")) == _by_id(_rows())
    _check_dead_letters(tmp_path / "dead", "routed")  # still exactly three
    _check_dead_letters(tmp_path / "dead-frame", "frame")
    assert _marks(tmp_path / "ledger") == {
        "routed": (len(GOOD), 3), "frame": (len(GOOD), 3), "all": (40, 0),
    }  # fmt: skip

    ran = fanout_cli("status", "--ledger", tmp_path / "ledger", "--json")
    assert ran.returncode == 0, ran
    status = {s["sink"]: s for s in json.loads(ran.stdout)}
    assert status["routed"]["dead_lettered_total"] == 3
    assert status["routed"]["rows_total"] == len(GOOD)
    assert status["all"]["dead_lettered_total"] == 0


def test_without_a_dead_letter_target_the_batch_fails_naming_sink_batch_and_expression(
    spark: Any, tmp_path: Path
) -> None:
    batch = spark.createDataFrame(_rows(), SCHEMA)
    frame = FrameSink("frame")
    sinks = _sinks(tmp_path, frame, dead_letter=False)
    fan = FanOut("rd", str(tmp_path / "ledger"), sinks, retries=0)
    with pytest.raises(BatchFailedError) as caught:
        fan.process(batch, BatchInfo("rd", 3, "q"))
    assert set(caught.value.failures) == {"routed", "frame"}
    for sink in ("routed", "frame"):
        error = caught.value.failures[sink]
        assert isinstance(error, RouteError), error
        assert (error.sink, error.batch_id, error.kind, error.expression) == (
            sink, 3, "where", WHERE,
        )  # fmt: skip
        text = str(error)
        assert text.startswith(f"sink {sink!r}, batch 3: route where {WHERE!r} failed: ")
        assert "[CAST_INVALID_INPUT]" in text
        assert "the sink has no dead-letter target" in text
        assert error.__cause__ is not None  # Spark's error, kept
    assert not (tmp_path / "routed").exists()  # nothing written
    assert frame.calls == []  # nor read
    assert len(delta_rows(tmp_path / "all")) == 40  # the other sink committed
    failed = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "failed"]
    assert sorted(r["sink"] for r in failed) == ["frame", "routed"]
    assert all("RouteError: sink " in r["error"] for r in failed)


def test_route_letters_and_the_sinks_own_letters_share_a_table_without_clashing(
    spark: Any, tmp_path: Path
) -> None:
    """A merge sink sends null keys to its dead-letter table itself; rows failing its
    route go to the same table under another transaction id: both land, each once."""
    rows = [{"k": 1, "amount": "1"}, {"k": None, "amount": "2"}, {"k": 3, "amount": "x"}]
    batch = spark.createDataFrame(rows, "k LONG, amount STRING")
    sink = {
        "type": "delta", "name": "latest", "path": str(tmp_path / "latest"), "mode": "merge",
        "keys": ["k"], "dead_letter": str(tmp_path / "dead"),
        "select": ["k", "CAST(amount AS INT) AS amount"],
    }  # fmt: skip
    for run in range(2):  # the second run is a replay under a fresh ledger: skipped writes
        ledger = tmp_path / f"ledger-{run}"
        result = FanOut("own", str(ledger), [sink]).process(batch, BatchInfo("own", 0, "q"))
        assert result["latest"].dead_lettered == 2  # one route letter, one null key
    assert delta_rows(tmp_path / "latest") == [{"k": 1, "amount": 1}]
    dead = sorted(delta_rows(tmp_path / "dead"), key=lambda d: d["reason"])
    assert [(json.loads(d["row"]), d["column"]) for d in dead] == [
        ({"k": None, "amount": 2}, "k"),
        ({"k": 3, "amount": "x"}, "amount"),
    ]
    assert dead[0]["reason"] == "null in key column 'k': a null key cannot be merged"
    assert dead[1]["reason"].startswith("route select 'CAST(amount AS INT) AS amount' failed: ")


def test_a_running_stream_parks_the_failing_rows_and_goes_on(spark: Any, tmp_path: Path) -> None:
    """Through foreachBatch: the batch holding malformed values commits its good rows, the
    next batches follow."""
    source = tmp_path / "input"
    source.mkdir()
    for n in range(3):
        lines = [json.dumps(r) for r in _rows()[n * 10 : n * 10 + 10]]
        path = source / f"part-{n}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (EPOCH + n, EPOCH + n))
    sink = {"type": "delta", "name": "routed", "path": str(tmp_path / "routed"),
            "where": WHERE, "select": SELECT, "dead_letter": str(tmp_path / "dead")}  # fmt: skip
    fan = FanOut("rd", str(tmp_path / "ledger"), [sink])
    run_stream(spark, source, fan, tmp_path / "checkpoint", schema=SCHEMA)
    assert _by_id(delta_rows(tmp_path / "routed")) == [r for r in GOOD if r["id"] < 30]
    dead = sorted(delta_rows(tmp_path / "dead"), key=lambda d: d["batch_id"])
    assert [(d["batch_id"], json.loads(d["row"])["id"]) for d in dead] == [(0, 5), (2, 22)]
    marks = sorted(
        (r["batch_id"], r["rows"], r["dead_lettered"])
        for r in delta_rows(tmp_path / "ledger")
        if r["status"] == "committed"
    )
    assert marks == [(0, 9, 1), (1, 10, 0), (2, 9, 1)]


class _Guarded(RecordingSink):
    """A sink holding a password."""

    def secret_values(self) -> list[str]:
        return ["Other-sink-pw-2207"]


def test_a_route_letter_s_reason_is_masked_of_the_pipeline_s_secrets(
    spark: Any, tmp_path: Path
) -> None:
    """Spark's error quotes the value that failed the route; one that is another sink's
    password is masked in the letter's reason as in the ledger (the row keeps the data)."""
    batch = spark.createDataFrame(
        [
            {"id": 1, "amount": "Other-sink-pw-2207", "qty": "1"},
            {"id": 2, "amount": "2", "qty": "2"},
        ],
        SCHEMA,
    )
    routed = {"type": "delta", "name": "routed", "path": str(tmp_path / "routed"),
              "where": WHERE, "dead_letter": str(tmp_path / "dead")}  # fmt: skip
    fan = FanOut("rm", str(tmp_path / "ledger"), [routed, _Guarded("guarded")])
    assert fan.process(batch, BatchInfo("rm", 0, "q"))["routed"].dead_lettered == 1
    (letter,) = delta_rows(tmp_path / "dead")
    assert letter["reason"].startswith(f"route where {WHERE!r} failed: " + CAST.format("***")), (
        letter["reason"]
    )
    assert "Other-sink-pw-2207" not in letter["reason"]
