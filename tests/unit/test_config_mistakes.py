"""A pipeline file reports every independent mistake in one run, not only its first:
``pipeline.paralelism`` used to hide a sink's ``dead_leter`` (``fanout validate`` and
``fanout run`` stopped at the first error of ``config.parse``). One ConfigurationError
lists each mistake in file order, each with today's text; exit code 2. No Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.app.config import parse
from fanout.errors import ConfigurationError

OPTIONS = {"delta": ["path", "mode", "keys", "dead_letter"]}

FILE = """\
[pipeline]
name = "orders"
ledger = "{d}/ledger"
checkpoint = "{d}/ckpt"
paralelism = 2

[source]
schema = "id INT"

[[sinks]]
type = "delta"
name = "bronze"
path = "{d}/bronze"
retries = "twice"

[[sinks]]
type = "delta"
name = "latest"
path = "{d}/latest"
dead_leter = "{d}/dead"
"""


@pytest.mark.parametrize("command", ["validate", "run"])
def test_every_mistake_of_the_file_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    file = tmp_path / "pipeline.toml"
    file.write_text(FILE.format(d=tmp_path))
    assert main([command, str(file)]) == 2
    assert capsys.readouterr() == (
        "",
        f"fanout: configuration error: 4 mistakes in {file}:\n"
        "  - pipeline.paralelism: unknown key, did you mean parallelism?\n"
        "  - source.format: missing required option\n"
        "  - sinks[0] (sink 'bronze', type 'delta'): option 'retries': expected int, got "
        "'twice' (str); one of fanout's own options of a sink (README: Running from a config "
        "file)\n"
        "  - sinks[1].dead_leter: unknown option, did you mean dead_letter?\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.toml"]


def test_a_misspelt_required_key_is_one_mistake_and_each_key_of_a_sink_is_named() -> None:
    doc = {
        "pipeline": {"name": "p", "ledger": "/l", "checkpont": "/c", "retries": "x"},
        "source": {"format": "rate"},
        "sinks": [
            {"type": "delta", "nmae": "d", "path": "/d"},
            {"type": "delta", "name": "e", "pth": "/e", "mdoe": "append", "retries": "x"},
            {"type": "delta", "name": "f/g", "path": "/f"},
        ],
    }
    with pytest.raises(ConfigurationError) as refused:
        parse(doc, OPTIONS)
    assert str(refused.value).splitlines() == [
        "7 mistakes in the pipeline file:",
        "  - pipeline.checkpont: unknown key, did you mean checkpoint?",
        "  - pipeline.retries: expected int, got 'x'",
        "  - sinks[0].nmae: unknown option, did you mean name?",
        "  - sinks[1].pth: unknown option, did you mean path?",
        "  - sinks[1].mdoe: unknown option, did you mean mode?",
        "  - sinks[1] (sink 'e', type 'delta'): option 'retries': expected int, got 'x' (str); "
        "one of fanout's own options of a sink (README: Running from a config file)",
        "  - sinks[2]: name 'f/g' is not valid; use 1-128 letters, digits, '_', '.' or '-', "
        "starting with a letter or digit",
    ]


def test_one_mistake_is_raised_with_its_own_text_alone() -> None:
    doc = {
        "pipeline": {"name": "p", "ledger": "/l", "checkpoint": "/c"},
        "source": {"format": "rate"},
        "sinks": [{"type": "delta", "name": "d", "path": "/d", "dead_leter": "/x"}],
    }
    with pytest.raises(ConfigurationError) as refused:
        parse(doc, OPTIONS)
    assert str(refused.value) == "sinks[0].dead_leter: unknown option, did you mean dead_letter?"


UNSET_FILE = """\
[pipeline]
name = "orders"
ledger = "${{FANOUT_T_LAKE}}/ledger"
checkpoint = "{d}/ckpt"
retries = "${{FANOUT_T_RETRIES}}"

[source]
format = "rate"
options = {{ rowsPerSecond = "${{FANOUT_T_RATE:-${{FANOUT_T_RATE_DEFAULT}}}}" }}

[sourse]
format = "rate"

[[sinks]]
type = "delta"
name = "bronze"
path = "${{FANOUT_T_LAKE}}/${{FANOUT_T_TABLE}}"

[[sinks]]
type = "delta"
name = "latest"
path = "${{FANOUT_T_SET:-${{FANOUT_T_NOT_NEEDED}}}}/latest"
"""


@pytest.mark.parametrize("command", ["validate", "run"])
def test_every_unset_variable_of_the_file_in_one_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """An unset ``${VAR}`` stopped the file's reading at the first: a data engineer setting
    the variables learnt of each one more run. Each value's unset variables are named (two
    in one value in one line, a default's only when the default is used), with the file's
    unknown section; the value checks stop there (``retries`` still reading
    ``${FANOUT_T_RETRIES}`` is not refused again as not an int)."""
    for name in ("LAKE", "RETRIES", "RATE", "RATE_DEFAULT", "TABLE", "NOT_NEEDED"):
        monkeypatch.delenv(f"FANOUT_T_{name}", raising=False)
    monkeypatch.setenv("FANOUT_T_SET", str(tmp_path))
    file = tmp_path / "pipeline.toml"
    file.write_text(UNSET_FILE.format(d=tmp_path))
    assert main([command, str(file)]) == 2
    out, err = capsys.readouterr()
    assert (out, err.splitlines()) == ("", [
        f"fanout: configuration error: 5 mistakes in {file}:",
        "  - sourse: unknown section, did you mean source?",
        "  - pipeline.ledger: environment variable 'FANOUT_T_LAKE' is referenced but not set; "
        "export FANOUT_T_LAKE=... before starting the pipeline",
        "  - pipeline.retries: environment variable 'FANOUT_T_RETRIES' is referenced but not "
        "set; export FANOUT_T_RETRIES=... before starting the pipeline",
        "  - source.options.rowsPerSecond: environment variable 'FANOUT_T_RATE_DEFAULT' is "
        "referenced but not set; export FANOUT_T_RATE_DEFAULT=... before starting the pipeline",
        "  - sinks[0].path: environment variables 'FANOUT_T_LAKE', 'FANOUT_T_TABLE' are "
        "referenced but not set; export FANOUT_T_LAKE=... FANOUT_T_TABLE=... before starting "
        "the pipeline",
    ])  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.toml"]


def test_a_value_naming_one_unset_variable_twice_names_it_once() -> None:
    """``${LAKE}/copy_of_${LAKE}`` with ``LAKE`` unset: the one variable said as one (the
    text an unset variable had alone), not as a list of one."""
    from fanout.observe.secrets import expand_env

    with pytest.raises(ConfigurationError) as refused:
        expand_env("${LAKE}/copy_of_${LAKE}", what="sinks[0].path", environ={})
    assert str(refused.value) == (
        "sinks[0].path: environment variable 'LAKE' is referenced but not set; "
        "export LAKE=... before starting the pipeline"
    )
    with pytest.raises(ConfigurationError) as refused:
        expand_env("${LAKE}/${TABLE}/${LAKE}", what="sinks[0].path", environ={})
    assert str(refused.value) == (
        "sinks[0].path: environment variables 'LAKE', 'TABLE' are referenced but not set; "
        "export LAKE=... TABLE=... before starting the pipeline"
    )
