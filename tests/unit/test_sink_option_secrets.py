"""Every location a pipeline is given is masked as its own: a sink's option holding a
location with credentials (a plugin sink's ``archive = "s3://KEY:SECRET@..."``, a SAS's
``?sig=``), whatever the sink declares (:meth:`fanout.Sink.secret_values`); the refusal of
two roles sharing one table names it masked; a pipeline file's ``source.options`` (or
``spark.conf``) given as a string is refused without its value.

Before, :class:`fanout.FanOut` gathered the ``dead_letter`` of each sink only: the error of
a sink quoting its other location reached the ledger, the raised error and the logs as
written; ``refuse_shared_tables`` quoted the location as written; and the pipeline file's
check printed the string (``got 'user=app password=...'``)."""

from __future__ import annotations

from typing import Any

import pytest

from fanout import ConfigurationError, FanOut, Sink, hookimpl
from fanout.app.config import parse
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.observe.logs import known_secrets, secrets_apart
from tests.unit.fakes import SchemaFrame

PASSWORD, SIG = "Arch-pw-55210", "ArchSig0123456789qrs"
ARCHIVE = f"s3://KEY:{PASSWORD}@bucket/archive"
SAS = f"abfss://c@acct.dfs.core.windows.net/copy?sv=2022&sp=rw&sig={SIG}"


class Archiving(Sink):
    """A plugin's sink with a second location among its options; it declares no secret."""

    def __init__(self, name: str, archive: str = "", copies: dict[str, str] | None = None) -> None:
        super().__init__(name)
        self.archive = archive
        self.copies = dict(copies or {})

    def write(self, batch: Any) -> int:
        raise RuntimeError(f"cannot reach {self.archive} nor {self.copies['sas']}")


class _Plugin:
    @hookimpl
    def fanout_sink_types(self) -> dict[str, type[Sink]]:
        return {"archiving": Archiving}


@pytest.mark.parametrize("given", ["dict", "instance"])
def test_a_sink_s_option_holding_a_location_with_credentials_is_a_pipeline_secret(
    given: str,
) -> None:
    options = {"archive": ARCHIVE, "copies": {"sas": SAS}}
    sink: Any = (
        {"type": "archiving", "name": "a", **options}
        if given == "dict"
        else Archiving("a", **options)
    )
    ledger = MemoryLedger()
    with secrets_apart():
        fan = FanOut("p", ledger, [sink], retries=0, backoff_s=0, plugins=[_Plugin()])
        assert {PASSWORD, SIG} <= set(fan.secrets)
        assert {PASSWORD, SIG} <= set(known_secrets())  # the log handlers' and the CLI's
        with pytest.raises(Exception) as failed:
            fan.process(SchemaFrame([1, 2]), BatchInfo("p", 0, "q"))
    said = str(failed.value)
    assert (
        "RuntimeError: cannot reach s3://KEY:***@bucket/archive nor "
        "abfss://c@acct.dfs.core.windows.net/copy?sv=2022&sp=rw&sig=***"
    ) in said, said
    recorded = [e.error for e in ledger.entries if e.error]
    assert len(recorded) == 1 and "s3://KEY:***@bucket/archive" in recorded[0], recorded
    for text in (said, *recorded):
        assert PASSWORD not in text and SIG not in text


class _Lettered(Sink):
    def __init__(self, name: str, dead_letter: str) -> None:
        super().__init__(name)
        self.dead_letter = dead_letter

    def write(self, batch: Any) -> int:
        return 0


def test_two_roles_in_one_table_are_refused_naming_it_masked() -> None:
    with secrets_apart(), pytest.raises(ConfigurationError) as refused:
        FanOut("p", "/tmp/rs-ledger-unused", [_Lettered("a", SAS)], spool=SAS)
    assert str(refused.value) == (
        "pipeline 'p': the spool and the dead letters of sink 'a' (option 'dead_letter') are "
        "one table, 'abfss://c@acct.dfs.core.windows.net/copy?sv=2022&sp=rw&sig=***': their "
        "rows have other layouts, so the second would fail on the first's schema in every "
        "batch; give each its own location"
    )
    with secrets_apart(), pytest.raises(ConfigurationError) as refused:
        FanOut("p", ARCHIVE, [_Lettered("a", f"delta:{ARCHIVE}")])
    assert "are one table, 's3://KEY:***@bucket/archive': " in str(refused.value)
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("section, key", [("source", "options"), ("spark", "conf")])
def test_a_table_given_as_a_string_is_refused_without_its_value(section: str, key: str) -> None:
    text = f"user=app password={PASSWORD}"
    doc: dict[str, object] = {
        "pipeline": {"name": "p", "ledger": "/l", "checkpoint": "/c"},
        "source": {"format": "rate"},
        "sinks": [{"type": "delta", "name": "d", "path": "/d"}],
    }
    doc.setdefault(section, {})
    doc[section][key] = text  # type: ignore[index]
    with pytest.raises(ConfigurationError) as refused:
        parse(doc, {"delta": ["path"]})
    assert str(refused.value) == (
        f"{section}.{key}: expected dict, got a string (its value not shown: it may hold a "
        f"secret); write it as a table, [{section}.{key}]"
    )


def test_a_sink_option_of_the_wrong_type_is_named_without_its_secrets() -> None:
    """A sink's mapping option given as a string (``storage_options = "key=..."``) is
    named by its type; a location in a value of another wrong type is shown masked."""
    given = {"storage_options": f"aws_secret_access_key={PASSWORD}", "path": [SAS]}
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", MemoryLedger(), [{"type": "delta", "name": "d", **given}])
    assert str(refused.value) == (
        "sink 'd' (type 'delta'): option 'storage_options': expected a mapping of str to (str "
        "or int or float or bool) or none, got a string (its value not shown: it may hold a "
        "secret); option 'path': expected str or PathLike or none, got "
        "['abfss://c@acct.dfs.core.windows.net/copy?sv=2022&sp=rw&sig=***'] (list); fix the "
        "value in the sink's configuration (`fanout plugins --options delta` describes each "
        "option)"
    )
