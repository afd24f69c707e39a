"""fanout's own options of a ``[[sinks]]`` entry (``retries``, ``backoff_s``, ``max_lag``,
``write_timeout_s``) take a number written as text, as ``${VAR}`` gives it, as the sink's
own options do; text that is no number is refused naming the entry, the option, the value
and the type it takes. The pipeline file reader with the installed sink types; no Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.app.runner import load_pipeline
from fanout.errors import ConfigurationError

HEAD = """
[pipeline]
name = "p"
ledger = "{d}/ledger"
checkpoint = "{d}/ckpt"
spool = "{d}/spool"
[source]
format = "rate"
"""


def _load(tmp_path: Path, sinks: str) -> list[dict[str, object]]:
    file = tmp_path / "pipeline.toml"
    file.write_text(HEAD.format(d=tmp_path) + sinks)
    return load_pipeline(str(file)).sinks


def _sink(tmp_path: Path, options: str) -> str:
    return f'[[sinks]]\ntype = "delta"\nname = "a"\npath = "{tmp_path}/a"\n{options}\n'


def test_numbers_written_as_text_are_read_as_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_lag = "${MAX_LAG}"` was refused (`max_lag must be a number, not '5'`) while a
    sink option from the same variable was read as 5."""
    monkeypatch.setenv("MAX_LAG", "5")
    monkeypatch.setenv("TIMEOUT", "8")
    sinks = _load(
        tmp_path,
        _sink(tmp_path, 'on_failure = "lag"\nmax_lag = "${MAX_LAG}"\n'
              'write_timeout_s = "${TIMEOUT}"\nretries = "3"\nbackoff_s = " 0.5 "\n')
        + f'[[sinks]]\ntype = "delta"\nname = "b"\npath = "{tmp_path}/b"\n'
        'on_failure = "lag"\nmax_lag = { batches = "7", age_s = "60.5" }\n',
    )  # fmt: skip
    assert sinks == [
        {"type": "delta", "name": "a", "path": f"{tmp_path}/a", "on_failure": "lag",
         "max_lag": 5, "write_timeout_s": 8, "retries": 3, "backoff_s": 0.5},
        {"type": "delta", "name": "b", "path": f"{tmp_path}/b", "on_failure": "lag",
         "max_lag": {"batches": 7, "age_s": 60.5}},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ('on_failure = "lag"\nwrite_timeout_s = "soon"',
         "option 'write_timeout_s': expected float, got 'soon' (str)"),
        ("retries = true", "option 'retries': expected int, got True (bool)"),
        ("retries = 2.5", "option 'retries': expected int, got 2.5 (float)"),
        ('backoff_s = "1s"', "option 'backoff_s': expected float, got '1s' (str)"),
        ('on_failure = "lag"\nmax_lag = "many"',
         "option 'max_lag': expected int, or a table of batches (int) and age_s (float), got "
         "'many' (str)"),
        ('on_failure = "lag"\nmax_lag = { age_s = "an hour" }',
         "option 'max_lag.age_s': expected float, got 'an hour' (str)"),
    ],
)  # fmt: skip
def test_text_that_is_no_number_is_refused_naming_the_entry_option_value_and_type(
    tmp_path: Path, options: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        _load(tmp_path, _sink(tmp_path, options))
    assert str(refused.value) == (
        f"sinks[0] (sink 'a', type 'delta'): {problem}; one of fanout's own options of a "
        "sink (README: Running from a config file)"
    )


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ('backoff_s = "nan"', "sink 'a': bad retries/backoff_s: backoff_s must be finite, not nan"),
        ('backoff_s = "inf"', "sink 'a': bad retries/backoff_s: backoff_s must be finite, not inf"),
        ('on_failure = "lag"\nmax_lag = { age_s = "nan" }',
         "sink 'a': max_lag.age_s must be finite, not nan"),
        ('on_failure = "lag"\nmax_lag = { batches = 3, age_s = "inf" }',
         "sink 'a': max_lag.age_s must be finite, not inf"),
        ('on_failure = "lag"\nmax_lag = { age_s = nan }',
         "sink 'a': max_lag.age_s must be finite, not nan"),
    ],
)  # fmt: skip
def test_a_number_that_is_not_finite_is_refused(tmp_path: Path, options: str, problem: str) -> None:
    """`"nan"` and `"inf"` are numbers to ``float()``: a backoff of nan was read as the
    longest wait and ``max_lag.age_s = nan`` bounded nothing (each comparison false), while
    the pipeline's own ``backoff_s`` refuses them (`must be a finite number`)."""
    with pytest.raises(ConfigurationError) as refused:
        _load(tmp_path, _sink(tmp_path, options))
    assert str(refused.value) == f"sinks[0]: {problem}"
