"""Dead letters: the one grammar, the core's Delta target and its one layout, and the Delta
sink's null merge keys."""

from __future__ import annotations

import json
import logging
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fanout_delta import DeltaSink

from fanout import ConfigurationError, FanOut, PluginError, Sink, SinkContext, hookimpl
from fanout.contract.dead_letters import DeadLetter, letter_rows, split_target
from fanout.deadletters.delta import DeltaDeadLetters, delta_target
from fanout.deadletters.held import refused_rows_held
from fanout.deadletters.layout import letter_json, letter_schema
from fanout.deadletters.target import resolve_target
from fanout.delta_tables.io import read_delta
from fanout.hooks.registry import load_registry
from fanout.ledger.memory import MemoryLedger
from fanout.testing import make_batch


def test_target_strings() -> None:
    assert split_target("/data/dead") == ("delta", "/data/dead")
    assert split_target("delta:/data/dead") == ("delta", "/data/dead")
    assert split_target("s3://bucket/dead") == ("delta", "s3://bucket/dead")
    assert split_target("postgres:ops.dead") == ("postgres", "ops.dead")
    assert split_target("kafka:dead-orders") == ("kafka", "dead-orders")


class Named(Sink):
    def __init__(self, name: str, dead_letter: object = None) -> None:
        super().__init__(name)
        self.dead_letter = dead_letter


def test_the_core_resolves_every_sinks_target_through_the_registered_kinds() -> None:
    kinds = load_registry(entry_points_=[]).dead_letter_kinds()
    assert sorted(kinds) == ["delta"]
    target = resolve_target(Named("s", "delta:/data/dead"), kinds)
    assert target == DeltaDeadLetters("/data/dead")  # "delta:" is not part of the path
    assert resolve_target(Named("s", "/data/dead"), kinds) == DeltaDeadLetters("/data/dead")
    assert resolve_target(Named("s"), kinds) is None
    with pytest.raises(ConfigurationError) as unknown:
        resolve_target(Named("bronze", "kafka:dead-orders"), kinds)
    assert str(unknown.value) == (
        "sink 'bronze': dead_letter 'kafka:dead-orders' is a kafka target, but no installed "
        "plugin provides that kind (kinds: delta)"
    )
    with pytest.raises(ConfigurationError, match="option 'dead_letter' must be a string"):
        resolve_target(Named("s", {"table": "x"}), kinds)


def test_a_plugin_adds_a_kind_through_the_hook() -> None:
    class Topics:
        @hookimpl
        def fanout_dead_letter_kinds(self) -> dict[str, object]:
            return {"queue": lambda location, sink: ("queue", location, sink.name)}

    kinds = load_registry([Topics()], entry_points_=[]).dead_letter_kinds()
    assert sorted(kinds) == ["delta", "queue"]
    assert resolve_target(Named("s", "queue:q1"), kinds) == ("queue", "q1", "s")  # type: ignore[comparison-overlap]

    class Again:
        @hookimpl
        def fanout_dead_letter_kinds(self) -> dict[str, object]:
            return {"delta": delta_target}

    registry = load_registry([Again()], entry_points_=[])
    with pytest.raises(PluginError, match="dead-letter kind 'delta' is provided by both"):
        registry.dead_letter_kinds()


def test_delta_dead_letters_are_written_once_per_batch(tmp_path: Path) -> None:
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    batch = make_batch([{"id": 1}], batch_id=7, pipeline="p", sink_name="pg")
    letters = [
        DeadLetter({"id": 1, "name": "x" * 3}, "value too long", "name", "xxx", 2, {"t": "o"})
    ]
    assert target.write(batch, letters, source="refused", partition=2) == 1
    assert target.write(batch, letters, source="refused", partition=2) == 1  # a replay
    table = read_delta(str(tmp_path / "dead"))
    assert table.schema.names == letter_schema().names  # the one layout
    rows = table.to_pylist()
    assert len(rows) == 1
    row = rows[0]
    assert (row["pipeline"], row["sink"], row["batch_id"]) == ("p", "pg", 7)
    assert (row["epoch"], row["source"], row["partition"]) == (0, "refused", 2)
    assert json.loads(row["details"]) == {"t": "o"}
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
    sink.open(SinkContext("p", dead_letters=DeltaDeadLetters(str(tmp_path / "dead"))))
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


def test_fanout_refuses_a_dead_letter_kind_nobody_provides(tmp_path: Path) -> None:
    sink = DeltaSink(name="b", path=str(tmp_path / "t"), dead_letter="queue:dead")
    with pytest.raises(ConfigurationError) as bad:
        FanOut("p", MemoryLedger(), [sink])
    assert "dead_letter 'queue:dead' is a queue target, but no installed plugin" in str(bad.value)


def test_delta_dead_letters_keep_every_value_of_the_row(tmp_path: Path) -> None:
    """A letter's ``row`` and ``value`` are JSON that loses nothing: binary as base64 (at
    any depth, map keys too), NaN and infinities as strings, -0.0, decimals as their
    digits, an instant in UTC (one before 1883 too, whose zone's offset has seconds), a
    timestamp without a zone as is, a day-time interval as an ISO 8601 duration, maps as
    objects (an empty one too; other keys as their JSON text)."""
    import pyarrow as pa

    york = "America/New_York"
    table = pa.table(
        {
            "id": pa.array([None], pa.int64()),
            "b": pa.array([b"\xff\x00"], pa.binary()),
            "s": pa.array(
                [{"x": b"\xfe", "n": float("nan")}],
                pa.struct([("x", pa.binary()), ("n", pa.float64())]),
            ),
            "l": pa.array([[b"\xfd", None]], pa.list_(pa.binary())),
            "f": pa.array([[float("inf"), float("-inf"), -0.0]], pa.list_(pa.float64())),
            "d": pa.array([Decimal("1.50")], pa.decimal128(5, 2)),
            "ts": pa.array([1_714_550_400_000_001], pa.timestamp("us", tz=york)),
            "old": pa.array([-2_840_140_800_000_000], pa.timestamp("us", tz=york)),
            "ntz": pa.array([datetime(2024, 5, 1, 8, 0, 0, 1)], pa.timestamp("us")),
            "day": pa.array([date(999, 1, 2)], pa.date32()),
            "dur": pa.array([timedelta(days=-1, microseconds=5)], pa.duration("us")),
            "mi": pa.array([[(1, "a"), (2, "b")]], pa.map_(pa.int32(), pa.string())),
            "mb": pa.array([[(b"\xff", 1.5)]], pa.map_(pa.binary(), pa.float64())),
            "ms": pa.array(
                [[({"k": 1}, b"\x01")]], pa.map_(pa.struct([("k", pa.int64())]), pa.binary())
            ),
            "me": pa.array([[]], pa.map_(pa.string(), pa.string())),
            "lm": pa.array([[[]]], pa.list_(pa.map_(pa.string(), pa.int8()))),
        }
    )
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    batch = make_batch([{"id": 1}], batch_id=0, pipeline="p", sink_name="s")
    letter = DeadLetter(letter_rows(table)[0], "null in key column 'id'", "b", b"\xff\x00")
    target.write(batch, [letter], source="refused")

    [row] = read_delta(str(tmp_path / "dead")).to_pylist()
    assert row["value"] == '"/wA="'
    assert row["row"] == (
        '{"id": null, "b": "/wA=", "s": {"x": "/g==", "n": "NaN"}, "l": ["/Q==", null], '
        '"f": ["Infinity", "-Infinity", -0.0], "d": "1.50", '
        '"ts": "2024-05-01T08:00:00.000001+00:00", "old": "1880-01-01T00:00:00+00:00", '
        '"ntz": "2024-05-01T08:00:00.000001", "day": "0999-01-02", '
        '"dur": "-P0DT86399.999995S", "mi": {"1": "a", "2": "b"}, "mb": {"/w==": 1.5}, '
        '"ms": {"{\\"k\\": 1}": "AQ=="}, "me": {}, "lm": [{}]}'
    )


def test_letter_json_of_values_a_sink_hands_over() -> None:
    """What a sink may put in a letter besides Arrow's rows: a map as a dict with keys
    JSON objects do not take (``collect()``), bare pairs, a bytearray, durations, a value
    of another type (its ``str()``)."""
    assert letter_json({1: b"a", b"\xff": None, 2.5: True}) == (
        '{"1": "YQ==", "/w==": null, "2.5": true}'
    )
    assert letter_json([(True, 1)]) == '{"true": 1}'
    assert letter_json(bytearray(b"\xfe")) == '"/g=="'
    assert letter_json(timedelta(days=1, seconds=3600, microseconds=500_000)) == '"P1DT3600.5S"'
    assert letter_json(timedelta(microseconds=-1)) == '"-P0DT0.000001S"'
    assert letter_json(timedelta(0)) == '"P0DT0S"'
    assert letter_json(time(23, 59, 59, 1)) == '"23:59:59.000001"'
    assert letter_json(complex(1, 2)) == '"(1+2j)"'


def test_letter_rows_write_dates_outside_python_s_years_as_spark_does_at_any_depth() -> None:
    """Arrow's ``to_pylist`` raises ``OverflowError`` for a date or timestamp outside the
    years 1-9999; :func:`letter_rows` hands such values over as Spark's ``to_json`` text,
    every value of that column alike (also on a slice, and in seconds or milliseconds)."""
    import pyarrow as pa

    year_10000 = 253_402_300_800_000_123  # microseconds: 10000-01-01T00:00:00.000123Z
    before_1 = -62_135_596_800_000_000 - 3_600_000_000  # 0000-12-31T23:00:00Z
    stamps = pa.array([0, year_10000, None, before_1], pa.timestamp("us", tz="UTC"))
    days = pa.array([0, 2_932_897, 5, -719_529], pa.int32()).cast(pa.date32())
    table = pa.table({
        "id": [1, 2, 3, 4],
        "s": pa.StructArray.from_arrays([stamps, days], names=["t", "d"]),
        "a": pa.array([[0], [year_10000, 0], None, []], pa.list_(pa.timestamp("us"))),
        "m": pa.array([[("k", 0)], [("k", 253_402_300_800_000)], None, [("z", 0)]],
                      pa.map_(pa.string(), pa.timestamp("ms", tz="UTC"))),
        "sec": pa.array([0, 0, 0, -62_135_596_801], pa.timestamp("s")),
    })  # fmt: skip

    rows = [json.loads(letter_json(row)) for row in letter_rows(table)]

    assert rows == [
        {"id": 1, "s": {"t": "1970-01-01T00:00:00+00:00", "d": "1970-01-01"},
         "a": ["1970-01-01T00:00:00"], "m": {"k": "1970-01-01T00:00:00+00:00"},
         "sec": "1970-01-01T00:00:00"},
        {"id": 2, "s": {"t": "+10000-01-01T00:00:00.000123+00:00", "d": "+10000-01-01"},
         "a": ["+10000-01-01T00:00:00.000123", "1970-01-01T00:00:00"],
         "m": {"k": "+10000-01-01T00:00:00+00:00"}, "sec": "1970-01-01T00:00:00"},
        {"id": 3, "s": {"t": None, "d": "1970-01-06"}, "a": None, "m": None,
         "sec": "1970-01-01T00:00:00"},
        {"id": 4, "s": {"t": "0000-12-31T23:00:00+00:00", "d": "-0001-12-31"}, "a": [],
         "m": {"z": "1970-01-01T00:00:00+00:00"}, "sec": "0000-12-31T23:59:59"},
    ]  # fmt: skip
    assert [json.loads(letter_json(r)) for r in letter_rows(table.slice(1, 1))] == rows[1:2]


def test_a_letter_spells_its_floats_as_spark_s_to_json() -> None:
    """A float in a letter is Spark's ``to_json`` text (``1.0E20``, a map key ``1.0E-4``,
    a ``float`` ``0.1`` and ``1.4E-45``), as the Kafka sink writes the row: Python's JSON
    wrote ``1e+20``, ``0.0001`` and the float's widened double ``0.10000000149011612``."""
    import pyarrow as pa

    table = pa.table(
        {
            "d": pa.array([1e20], pa.float64()),
            "f": pa.array([0.1], pa.float32()),
            "l": pa.array([[1.4e-45, None]], pa.list_(pa.float32())),
            "m": pa.array([[(1e-4, 1e7)]], pa.map_(pa.float64(), pa.float64())),
            "n": pa.array([float("-inf")], pa.float64()),
        }
    )
    assert letter_json(letter_rows(table)[0]) == (
        '{"d": 1.0E20, "f": 0.1, "l": [1.4E-45, null], "m": {"1.0E-4": 1.0E7}, "n": "-Infinity"}'
    )
    assert letter_json(5e-324) == "4.9E-324"


def _shared_table_cases(d: Path) -> dict[str, tuple[dict, str | None, str]]:
    """FanOut arguments, the two roles the refusal names (``None``: accepted) and the
    location as the second role gives it."""
    own, ledger, spool = str(d / "t"), str(d / "ledger"), str(d / "spool")
    table = "the table of sink 'a' (option 'path')"
    letters = "the dead letters of sink {} (option 'dead_letter')"
    sink_a = {"type": "delta", "name": "a", "path": own}
    (d / "alias").symlink_to(d, target_is_directory=True)
    return {
        "letters in the sink's own table": (
            {"ledger": ledger, "sinks": [{**sink_a, "dead_letter": own + "/"}]},
            f"{table} and {letters.format(repr('a'))}",
            own + "/",
        ),
        "letters in the sink's table through a linked directory": (
            {"ledger": ledger, "sinks": [{**sink_a, "dead_letter": str(d / "alias" / "t")}]},
            f"{table} and {letters.format(repr('a'))}",
            str(d / "alias" / "t"),
        ),
        "letters in the ledger": (
            {"ledger": ledger, "sinks": [{**sink_a, "dead_letter": f"file://{ledger}"}]},
            f"the ledger and {letters.format(repr('a'))}",
            f"file://{ledger}",
        ),
        "letters in another sink's table": (
            {
                "ledger": ledger,
                "sinks": [
                    sink_a,
                    {"type": "delta", "name": "b", "path": str(d / "u"), "dead_letter": own},
                ],
            },
            f"{table} and {letters.format(repr('b'))}",
            own,
        ),
        "a sink writing the ledger": (
            {"ledger": ledger, "sinks": [{**sink_a, "path": ledger}]},
            "the ledger and the table of sink 'a' (option 'path')",
            ledger,
        ),
        "a sink writing the spool": (
            {
                "ledger": ledger,
                "spool": spool,
                "sinks": [{**sink_a, "path": spool, "on_failure": "lag"}],
            },
            "the spool and the table of sink 'a' (option 'path')",
            spool,
        ),
        "two sinks' letters in one table": (
            {
                "ledger": ledger,
                "sinks": [
                    {**sink_a, "dead_letter": str(d / "dead")},
                    {
                        "type": "delta",
                        "name": "b",
                        "path": str(d / "u"),
                        "dead_letter": str(d / "dead"),
                    },
                ],
            },
            None,
            "",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "letters in the sink's own table",
        "letters in the sink's table through a linked directory",
        "letters in the ledger",
        "letters in another sink's table",
        "a sink writing the ledger",
        "a sink writing the spool",
        "two sinks' letters in one table",
    ],
)
def test_one_table_in_two_roles_is_refused_when_the_fanout_is_built(
    tmp_path: Path, case: str
) -> None:
    """A dead-letter table at a sink's table (or the ledger, the spool...) took the letters'
    layout or failed on the other's schema: a Delta merge's first null key created the
    sink's table as a dead-letter table, and every replay failed on its schema. Refused
    before the stream starts, naming both roles; roles of one kind may share a table."""
    arguments, roles, location = _shared_table_cases(tmp_path)[case]
    if roles is None:
        FanOut("p", **arguments)
        return
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", **arguments)
    assert str(refused.value) == (
        f"pipeline 'p': {roles} are one table, {location!r}: their rows have other layouts, so "
        "the second would fail on the first's schema in every batch; give each its own "
        "location"
    )


class _Unreadable:
    """A target whose read fails quoting a credential."""

    def describe(self) -> str:
        return "Delta table s3://bucket/dead"

    def read_rows(self, pipeline: str, sink: str, key: tuple[int, int]) -> Any:
        raise OSError("403 for key AKIA-SECRET-KEY-123")


class _Blind:
    """A target that cannot say what it holds (no ``read_rows``)."""

    def describe(self) -> str:
        return "Kafka topic dlq"


def test_refused_rows_held_counts_the_batch_refused_letters_a_target_can_tell_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    assert refused_rows_held(target, "p", "pg", (0, 7)) == 0  # no table yet
    letters = [DeadLetter({"id": i}, "refused") for i in range(3)]
    target.write(make_batch([{"id": 1}], batch_id=7, pipeline="p", sink_name="pg"), letters,
                 source="refused", partition=1)  # fmt: skip
    routed = make_batch([{"id": 1}], batch_id=8, pipeline="p", sink_name="pg")
    target.write(routed, letters[:1], source="route")  # a route's: not the sink's own
    later = make_batch([{"id": 1}], batch_id=7, pipeline="p", sink_name="pg", epoch=1)
    target.write(later, letters[:2], source="refused")  # the same batch id, another epoch
    assert refused_rows_held(target, "p", "pg", (0, 7)) == 3
    assert refused_rows_held(target, "p", "pg", (1, 7)) == 2
    assert refused_rows_held(target, "p", "pg", (0, 8)) == 0
    assert refused_rows_held(target, "p", "other", (0, 7)) == 0
    assert refused_rows_held(None, "p", "pg", (0, 7)) == 0
    assert refused_rows_held(_Blind(), "p", "pg", (0, 7)) == 0  # type: ignore[arg-type]
    assert caplog.records == []

    asking = logging.getLogger("tests.asking_sink")
    with caplog.at_level("WARNING"):
        held = refused_rows_held(_Unreadable(), "p", "pg", (0, 7),  # type: ignore[arg-type]
                                 secrets=["AKIA-SECRET-KEY-123"], logger=asking)  # fmt: skip
    assert held == 0
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (
            "tests.asking_sink",
            "sink 'pg', batch 7: cannot read its dead letters in Delta table s3://bucket/dead "
            "(403 for key ***): counted as not there",
        )
    ]


def test_delta_dead_letters_replace_only_the_batchs_refused_letters_of_the_sink(
    tmp_path: Path,
) -> None:
    """An upsert replay's letters replace its batch's (``DeltaDeadLetters.replace``): the
    letters of another batch, another sink and the route stay; the same letters again
    commit nothing; a replay with none removes the batch's."""
    from deltalake import DeltaTable

    target = DeltaDeadLetters(str(tmp_path / "dead"))
    pg7 = make_batch([{"id": 1}], batch_id=7, pipeline="p", sink_name="pg")
    pg6 = make_batch([{"id": 1}], batch_id=6, pipeline="p", sink_name="pg")
    other = make_batch([{"id": 1}], batch_id=7, pipeline="p", sink_name="pg'2")

    def letter(key: int) -> DeadLetter:
        return DeadLetter({"id": key}, "fk", "parent", str(key), None)

    target.write(pg6, [letter(60)], source="refused")
    target.write(other, [letter(70)], source="refused")
    target.write(pg7, [letter(71)], source="route")
    assert target.replace(pg7, [letter(1), letter(2)], source="refused") == 2  # first: appended

    def held() -> list[tuple[str, int, str, int]]:
        rows = read_delta(str(tmp_path / "dead")).to_pylist()
        found = [(r["sink"], r["batch_id"], r["source"], json.loads(r["row"])["id"]) for r in rows]
        return sorted(found)

    kept = [("pg", 6, "refused", 60), ("pg", 7, "route", 71), ("pg'2", 7, "refused", 70)]
    assert held() == sorted([*kept, ("pg", 7, "refused", 1), ("pg", 7, "refused", 2)])
    version = DeltaTable(str(tmp_path / "dead")).version()
    assert target.replace(pg7, [letter(2), letter(1)], source="refused") == 2  # the same
    assert DeltaTable(str(tmp_path / "dead")).version() == version  # nothing committed
    assert target.replace(pg7, [letter(2)], source="refused") == 1
    assert held() == sorted([*kept, ("pg", 7, "refused", 2)])
    assert target.replace(pg7, [], source="refused") == 0
    assert held() == kept
    # the batch's transaction stays recorded: a later write() of it is still skipped
    assert target.write(pg7, [letter(3)], source="refused") == 1
    assert held() == kept


def test_delta_dead_letters_replace_reads_again_after_losing_a_commit_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer committing to the letters table between ``replace``'s read and its
    overwrite (here the sink's letters of another batch; a compaction alike) makes delta-rs
    refuse the overwrite as a concurrent transaction: ``replace`` reads again and
    commits, keeping the other writer's letters (before, the batch failed with
    ``CommitFailedError``)."""
    import deltalake

    target = DeltaDeadLetters(str(tmp_path / "dead"))
    pg3 = make_batch([{"id": 1}], batch_id=3, pipeline="p", sink_name="pg")
    pg4 = make_batch([{"id": 1}], batch_id=4, pipeline="p", sink_name="pg")

    def letter(key: int) -> DeadLetter:
        return DeadLetter({"id": key}, "fk", "parent", str(key), None)

    target.write(pg3, [letter(1)], source="refused")
    overwrites: list[int] = []
    write = deltalake.write_deltalake

    def racing(table: Any, data: Any, **kwargs: Any) -> Any:
        if kwargs.get("mode") == "overwrite":
            overwrites.append(data.num_rows)
            if len(overwrites) == 1:  # another writer commits between the read and this
                target.write(pg4, [letter(40)], source="refused")
        return write(table, data, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", racing)
    assert target.replace(pg3, [letter(2)], source="refused") == 1
    assert overwrites == [1, 1]  # read again and committed after the lost race
    rows = read_delta(str(tmp_path / "dead")).to_pylist()
    found = sorted((r["batch_id"], json.loads(r["row"])["id"]) for r in rows)
    assert found == [(3, 2), (4, 40)]


def test_delta_dead_letters_replace_quotes_the_pipeline_and_sink_in_its_predicate(
    tmp_path: Path,
) -> None:
    """``replace``'s overwrite predicate (SQL for delta-rs) quotes the names it compares: a
    pipeline and a sink named with quotes, a backslash and SQL replace only their batch's
    letters, and a sink whose name the replaced one's begins with keeps its own."""
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    pipeline, sink = "it's", "pg' OR 'x'='x\\"
    batch = make_batch([{"id": 1}], batch_id=5, pipeline=pipeline, sink_name=sink)
    near = make_batch([{"id": 1}], batch_id=5, pipeline=pipeline, sink_name="pg")

    def letter(key: int) -> DeadLetter:
        return DeadLetter({"id": key}, "fk", "parent", str(key), None)

    target.write(batch, [letter(1)], source="refused")
    target.write(near, [letter(2)], source="refused")
    assert target.replace(batch, [letter(3)], source="refused") == 1
    rows = read_delta(str(tmp_path / "dead")).to_pylist()
    found = sorted((r["pipeline"], r["sink"], json.loads(r["row"])["id"]) for r in rows)
    assert found == [(pipeline, "pg", 2), (pipeline, sink, 3)]
