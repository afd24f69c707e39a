"""Pipeline files: the shipped example parses; errors name the key path and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.app.cli import main
from fanout.app.config import load, parse
from fanout.app.interval import interval_ms
from fanout.app.runner import sink_option_names
from fanout.errors import ConfigurationError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.toml"
OPTIONS = {"postgres": ["url", "table", "keys", "mode"], "delta": ["path", "mode", "keys"]}


def _doc(**sections: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "pipeline": {"name": "p", "ledger": "/l", "checkpoint": "/c"},
        "source": {"format": "rate"},
        "sinks": [{"type": "delta", "name": "d", "path": "/d"}],
    }
    doc.update(sections)
    return doc


def test_the_shipped_example_parses_with_the_installed_plugins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FANOUT_DATA", "/data/x")
    monkeypatch.setenv("FANOUT_METRICS_PORT", "9999")
    for name in ("FANOUT_PG_URL", "PGPASSWORD", "FANOUT_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(name, raising=False)
    config = load(EXAMPLE, sink_option_names())
    assert config.name == "orders"
    assert config.ledger == "/data/x/_fanout/ledger"
    assert config.trigger == {"processing_time": "2 seconds"}
    assert [s["name"] for s in config.sinks] == [
        "bronze",
        "paid",
        "latest",
        "orders_pg",
        "order_events",
    ]
    assert config.sinks[3]["url"] == "postgresql+psycopg2://fanout:fanout@127.0.0.1:5432/fanout"
    assert config.sinks[4]["bootstrap_servers"] == "127.0.0.1:9092"
    assert config.sinks[1]["where"] == "status = 'paid'"
    assert config.metrics == {"port": 9999, "host": "127.0.0.1"}


def test_unknown_sink_option_names_its_path_and_the_closest_option() -> None:
    sinks = [
        {"type": "delta", "name": "a", "path": "/a"},
        {"type": "delta", "name": "b", "path": "/b"},
        {"type": "postgres", "name": "pg", "url": "x", "tabel": "orders"},
    ]
    with pytest.raises(Exception) as bad:
        parse(_doc(sinks=sinks), OPTIONS)
    assert str(bad.value) == "sinks[2].tabel: unknown option, did you mean table?"


def test_a_sink_type_of_no_installed_plugin_says_how_to_get_it() -> None:
    """A type that is no misspelling (a sink of your own, not installed) was told only
    "unknown sink type 'csv'; installed: delta, postgres", leaving a newcomer to guess that
    a pipeline file loads installed plugins only and what to install; it now says the
    file's own ``plugins`` key too."""
    with pytest.raises(ConfigurationError) as bad:
        parse(_doc(sinks=[{"type": "csv", "name": "mine", "path": "/m.csv"}]), OPTIONS)
    assert str(bad.value) == (
        "sinks[0].type: unknown sink type 'csv'; installed: delta, postgres; a pipeline file "
        "uses the installed plugins and the modules its top-level plugins = [...] names: "
        "install the distribution providing 'csv' (`pip install -e .` in its directory), "
        "then `fanout plugins` lists it, or name the module of your own registering it "
        '(plugins = ["my_sinks"] for my_sinks.py in the working directory)'
    )


def test_a_sink_under_one_bracket_is_told_to_use_two() -> None:
    """``[sinks]`` (one bracket: a table, not an array of tables) was refused as
    "sinks: at least one [[sinks]] entry is required", though the file holds one."""
    with pytest.raises(ConfigurationError) as bad:
        parse(_doc(sinks={"type": "delta", "name": "d", "path": "/d"}), OPTIONS)
    assert str(bad.value) == (
        "sinks: a single table ([sinks]); each sink is an entry of an array of tables: "
        "write its header with two brackets, [[sinks]], once per sink"
    )


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc(pipelin={}), "pipelin: unknown section, did you mean pipeline?"),
        (
            _doc(pipeline={"name": "p", "ledger": "/l", "checkpont": "/c"}),
            "pipeline.checkpont: unknown key, did you mean checkpoint?",
        ),
        (
            _doc(pipeline={"name": "p", "checkpoint": "/c"}),
            "pipeline.ledger: missing required option",
        ),
        (_doc(sinks=[{"type": "delta", "path": "/d"}]), "sinks[0].name: missing required option"),
        (
            _doc(sinks=[{"type": "deltta", "name": "d"}]),
            "sinks[0].type: unknown sink type 'deltta', did you mean delta?; "
            "installed: delta, postgres",
        ),
        (
            _doc(
                pipeline={
                    "name": "p",
                    "ledger": "/l",
                    "checkpoint": "/c",
                    "trigger": {"processing_tme": "1 second"},
                }
            ),
            "pipeline.trigger.processing_tme: unknown key, did you mean processing_time?",
        ),
        (_doc(metrics={"port": "many"}), "metrics.port: expected int, got 'many'"),
    ],
)
def test_config_errors_name_the_key(doc: dict[str, object], message: str) -> None:
    with pytest.raises(Exception) as bad:
        parse(doc, OPTIONS)
    assert str(bad.value) == message


def test_cli_exit_code_2_for_a_bad_env_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FANOUT_NOPE", raising=False)
    file = tmp_path / "p.toml"
    file.write_text(
        '[pipeline]\nname = "p"\nledger = "${FANOUT_NOPE}/l"\ncheckpoint = "/c"\n'
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "d"\npath = "/d"\n'
    )
    assert main(["run", str(file)]) == 2
    assert capsys.readouterr().err.strip() == (
        "fanout: configuration error: pipeline.ledger: environment variable 'FANOUT_NOPE' "
        "is referenced but not set; export FANOUT_NOPE=... before starting the pipeline"
    )


def test_cli_exit_code_2_for_unknown_option_and_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "p.toml"
    file.write_text(
        '[pipeline]\nname = "p"\nledger = "/l"\ncheckpoint = "/c"\n'
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "d"\npth = "/d"\n'
    )
    assert main(["validate", str(file)]) == 2
    assert "sinks[0].pth: unknown option, did you mean path?" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.toml")]) == 2
    assert "no such pipeline file" in capsys.readouterr().err


def test_a_sink_expanding_its_own_option_gets_it_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fanout_postgres.url import resolve_url

    from fanout.app.runner import sink_self_expanded_options

    monkeypatch.setenv("FANOUT_TEST_PW", "p@ss/w%rd")
    monkeypatch.setenv("FANOUT_TEST_TABLE", "orders")
    file = tmp_path / "p.toml"
    file.write_text(
        '[pipeline]\nname = "p"\nledger = "/l"\ncheckpoint = "/c"\n[source]\nformat = "rate"\n'
        '[[sinks]]\ntype = "postgres"\nname = "pg"\n'
        'url = "postgresql://app:${FANOUT_TEST_PW}@db.example:5432/shop"\n'
        'table = "${FANOUT_TEST_TABLE}"\n'
    )
    self_expanded = sink_self_expanded_options()
    assert self_expanded["postgres"] == ["url"] and self_expanded["delta"] == []
    sink = load(file, sink_option_names(), self_expanded).sinks[0]
    assert sink["url"] == "postgresql://app:${FANOUT_TEST_PW}@db.example:5432/shop"
    assert sink["table"] == "orders"
    url = resolve_url(sink["url"], sink="pg")
    assert (url.password, url.host, url.port, url.database) == (
        "p@ss/w%rd", "db.example", 5432, "shop",
    )  # fmt: skip


def test_a_pipeline_file_that_cannot_be_read_is_a_configuration_error(tmp_path: Path) -> None:
    from fanout.errors import ConfigurationError

    with pytest.raises(ConfigurationError) as directory:
        load(tmp_path, OPTIONS)
    assert str(directory.value) == f"{tmp_path}: cannot be read: Is a directory"
    binary = tmp_path / "p.toml"
    binary.write_bytes(b"name = \xff\xfe\n")
    with pytest.raises(ConfigurationError) as undecodable:
        load(binary, OPTIONS)
    assert str(undecodable.value) == f"{binary}: not UTF-8 text (TOML is): invalid start byte"


# -- values out of range: refused by parse (so by `fanout validate`), exit code 2 ----------

_PIPELINE = {"name": "p", "ledger": "/l", "checkpoint": "/c"}
_INTERVAL_HINT = (
    "write it as '10 seconds', '1 minute 30 seconds' or '500 milliseconds' (units week, day, "
    "hour, minute, second, millisecond, microsecond; no abbreviations; not negative)"
)


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("pipeline", "retries", -1, "pipeline.retries: must be >= 0, got -1"),
        ("pipeline", "retries", "-2", "pipeline.retries: must be >= 0, got -2"),  # ${VAR}
        ("pipeline", "backoff_s", -0.5, "pipeline.backoff_s: must be >= 0, got -0.5"),
        ("pipeline", "backoff_s", float("nan"),
         "pipeline.backoff_s: must be a finite number, got nan"),
        ("pipeline", "parallelism", 0, "pipeline.parallelism: must be >= 1, got 0"),
        ("pipeline", "stop_timeout_s", -1, "pipeline.stop_timeout_s: must be >= 0, got -1"),
        ("pipeline", "stop_timeout_s", float("inf"),
         "pipeline.stop_timeout_s: must be a finite number, got inf"),
        ("pipeline", "probe_interval_s", 0, "pipeline.probe_interval_s: must be > 0, got 0"),
        ("pipeline", "ledger", " ", "pipeline.ledger: must not be empty"),
        ("pipeline", "checkpoint", "", "pipeline.checkpoint: must not be empty"),
        ("pipeline", "spool", "", "pipeline.spool: must not be empty"),
        ("metrics", "port", -1, "metrics.port: must be >= 0, got -1"),
        ("metrics", "port", 70000, "metrics.port: must be <= 65535, got 70000"),
        ("pipeline", "trigger", {"processing_time": "ten seconds"},
         f"pipeline.trigger.processing_time: Spark cannot read 'ten seconds' as an interval; "
         f"{_INTERVAL_HINT}"),
        ("pipeline", "trigger", {"processing_time": "10s"},
         f"pipeline.trigger.processing_time: Spark cannot read '10s' as an interval; "
         f"{_INTERVAL_HINT}"),
    ],
)  # fmt: skip
def test_a_value_out_of_range_is_refused_naming_its_key(
    section: str, key: str, value: object, message: str
) -> None:
    base = dict(_PIPELINE) if section == "pipeline" else {}
    with pytest.raises(ConfigurationError) as bad:
        parse(_doc(**{section: {**base, key: value}}), OPTIONS)
    assert str(bad.value) == message


@pytest.mark.parametrize(
    ("key", "value"),
    [("retries", 0), ("backoff_s", 0), ("parallelism", 1), ("stop_timeout_s", 0),
     ("probe_interval_s", 0.5)],
)  # fmt: skip
def test_the_least_allowed_values_are_taken(key: str, value: float) -> None:
    config = parse(_doc(pipeline={**_PIPELINE, key: value}), OPTIONS)
    assert getattr(config, key) == value


def test_the_cli_exits_2_for_a_value_out_of_range(tmp_path: Path, capsys: Any) -> None:
    file = tmp_path / "p.toml"
    file.write_text(
        '[pipeline]\nname = "p"\nledger = "/l"\ncheckpoint = "/c"\nretries = -1\n'
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "d"\npath = "/d"\n'
    )
    assert main(["validate", str(file)]) == 2
    assert capsys.readouterr().err == (
        "fanout: configuration error: pipeline.retries: must be >= 0, got -1\n"
    )


@pytest.mark.parametrize("key", ["available_now", "once"])
def test_a_trigger_set_to_false_is_refused_saying_what_to_write(key: str) -> None:
    with pytest.raises(ConfigurationError) as bad:
        parse(_doc(pipeline={**_PIPELINE, "trigger": {key: False}}), OPTIONS)
    assert str(bad.value) == (
        f"pipeline.trigger.{key}: false is not a trigger (Spark would run its default "
        "trigger, continuously, which the file does not say); to drain what the source holds "
        f"and stop, write trigger = {{ {key} = true }}; to run continuously, leave trigger "
        "out (the next batch as soon as the last one is done) or write trigger = "
        '{ processing_time = "10 seconds" }'
    )
    assert parse(_doc(pipeline={**_PIPELINE, "trigger": {key: True}}), OPTIONS).trigger == {
        key: True
    }


def test_validate_exits_2_for_available_now_false(tmp_path: Path, capsys: Any) -> None:
    file = tmp_path / "p.toml"
    file.write_text(
        '[pipeline]\nname = "p"\nledger = "/l"\ncheckpoint = "/c"\n'
        "trigger = { available_now = false }\n"
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "d"\npath = "/d"\n'
    )
    assert main(["validate", str(file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "fanout: configuration error: pipeline.trigger.available_now: false is not a trigger"
    )
    assert "write trigger = { available_now = true }" in err


# What Spark 4.2's processing-time trigger took and refused (Trigger.ProcessingTime against a
# real session), and the interval in milliseconds it read.
SPARK_INTERVALS: dict[str, int | None] = {
    "10 seconds": 10_000, "10 second": 10_000, "10 SECONDS": 10_000,
    "interval 10 seconds": 10_000, "INTERVAL\t10 seconds": 10_000, "  10 seconds\n": 10_000,
    "1 minute": 60_000, "1 minutes": 60_000, "500 milliseconds": 500, "1 millisecond": 1,
    "1 microsecond": 0, "0 seconds": 0, "1 hour": 3_600_000, "1 day": 86_400_000,
    "1 week 2 days": 777_600_000, "1 minute 30 seconds": 90_000, "1 minute -30 seconds": 30_000,
    "1.5 seconds": 1_500, ".5 seconds": 500, "1. seconds": 1_000, "+10 seconds": 10_000,
    "1.0000001 seconds": 1_000, "0 years 10 seconds": 10_000,
    "1 year -12 months 10 seconds": 10_000, "-1 millisecond 1 second": 999,
    "500 ms": None, "10s": None, "10 s": None, "10 sec": None, "1 min": None, "1 hr": None,
    "1 month": None, "1 year": None, "-10 seconds": None, "- 10 seconds": None, "10": None,
    "ten seconds": None, "10seconds": None, "0.5 minute": None, "1.5 milliseconds": None,
    "1.1234567891 seconds": None, "1e3 milliseconds": None, "interval '10' second": None,
    "10 seconds ago": None, "interval": None, "": None, " ": None, "1 weekss": None,
    "1,000 seconds": None, "1 minute, 30 seconds": None, "00:00:10": None, "+-1 seconds": None,
    "9223372036854775807 seconds": None, "2147483648 days": None, "\uff11 seconds": None,
}  # fmt: skip


@pytest.mark.parametrize(("text", "ms"), SPARK_INTERVALS.items())
def test_processing_time_is_read_as_spark_reads_it(text: str, ms: int | None) -> None:
    assert interval_ms(text) == ms


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"write_timeout_s": "8s", "on_failure": "lag"},
         "sinks[0] (sink 'd', type 'delta'): option 'write_timeout_s': expected float, got "
         "'8s' (str)"),
        ({"on_failure": "lagg"},
         "sinks[0]: sink 'd': on_failure must be 'stop' or 'lag', not 'lagg'"),
        ({"write_timeout_s": 8}, "sinks[0]: sink 'd': write_timeout_s=8 only applies with "
         "on_failure='lag', not 'stop'"),
    ],
)  # fmt: skip
def test_fanouts_own_sink_options_are_checked_before_spark_starts(
    options: dict[str, object], message: str
) -> None:
    """They were checked only when FanOut was built, after the Spark session had started
    (20 s), and without the entry's path."""
    sink = {"type": "delta", "name": "d", "path": "/d", **options}
    with pytest.raises(ConfigurationError) as bad:
        parse(_doc(sinks=[sink]), OPTIONS)
    assert str(bad.value).startswith(message)
