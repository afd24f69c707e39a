"""Table locations delta-rs cannot use are refused before the stream starts, naming the
path and the escape (fanout.delta_tables.io.unusable_location): delta-rs would create the
directory as named and fail its first commit looking for the decoded name."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from fanout import FanOut
from fanout.delta_tables.io import unusable_location
from fanout.errors import ConfigurationError
from fanout.ledger.delta import DeltaLedger


@pytest.mark.parametrize(
    ("location", "escape"),
    [
        ("/data/a%41b", "%41"),
        ("/data/my%20lake/t", "%20"),
        ("file:///data/c%2541d", "%41"),  # an escaped '%': still an escape once decoded
        ("/data/100%", None),
        ("/data/100%done", None),
        ("/data/my lake #1", None),
        ("file:///data/my%20lake", None),  # decoded: /data/my lake
        ("s3://bucket/a%41b", None),  # object stores are not local paths
    ],
)
def test_local_paths_with_a_percent_escape_are_unusable(location: str, escape: str | None) -> None:
    found = unusable_location(location)
    if escape is None:
        assert found is None
    else:
        assert found is not None and f"holds {escape!r}" in found


def test_delta_rs_indeed_fails_on_such_a_path(tmp_path: Path) -> None:
    # the behaviour the check guards against (deltalake 1.x); when delta-rs fixes it, this
    # test fails and the check can go
    with pytest.raises(Exception, match="File not found"):
        write_deltalake(str(tmp_path / "a%41b"), pa.table({"id": [1]}))


def test_a_sink_on_such_a_path_is_refused_when_the_fanout_is_built(tmp_path: Path) -> None:
    path = tmp_path / "lake%41"
    with pytest.raises(ConfigurationError) as refused:
        FanOut(
            "p", str(tmp_path / "ledger"), [{"type": "delta", "name": "bronze", "path": str(path)}]
        )
    message = str(refused.value)
    assert message.startswith("Delta sink 'bronze': option 'path': the local path ")
    assert f"{str(path)!r} holds '%41'" in message
    assert not path.exists()


def test_a_ledger_on_such_a_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger%2F"
    with pytest.raises(ConfigurationError, match=r"ledger at .*ledger%2F: .* holds '%2F'"):
        DeltaLedger(str(path)).open()
    assert not path.exists()


def test_a_dead_letter_table_on_such_a_path_is_refused(tmp_path: Path) -> None:
    dead = tmp_path / "dead%41"
    sink = {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"),
            "dead_letter": f"delta:{dead}"}  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", str(tmp_path / "ledger"), [sink])
    assert str(refused.value).startswith(f"sink 'bronze': dead_letter {str(dead)!r}: the local")
    assert "holds '%41'" in str(refused.value)


def test_a_spool_on_such_a_path_is_refused(tmp_path: Path) -> None:
    spool = tmp_path / "spool%41"
    sink = {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"),
            "on_failure": "lag"}  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", str(tmp_path / "ledger"), [sink], spool=str(spool))
    assert str(refused.value).startswith(f"pipeline 'p': spool {str(spool)!r}: the local")
    assert not spool.exists()


UNSAFE = {"AWS_S3_ALLOW_UNSAFE_RENAME": "true", "AWS_SECRET_ACCESS_KEY": "s3-Secret-9"}


@pytest.mark.parametrize(
    ("location", "options", "environ", "named"),
    [
        ("s3://b/t", {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, {}, "storage option AWS_S3_"),
        ("s3://b/t", {"aws_s3_allow_unsafe_rename": "YES"}, {}, "storage option aws_s3_"),
        ("s3://b/t", {"AWS_S3_ALLOW_UNSAFE_RENAME": "false"}, {}, None),
        ("s3://b/t", {}, {"AWS_S3_ALLOW_UNSAFE_RENAME": "1"}, "environment variable AWS_S3_"),
        ("s3://b/t", {"conditional_put": "etag"}, {}, None),
        ("/data/t", {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, {}, None),  # local: no S3 log store
    ],
)
def test_an_object_store_allowed_unsafe_renames_is_unusable(
    location: str, options: dict[str, str], environ: dict[str, str], named: str | None
) -> None:
    import fanout.delta_tables.io as deltaio

    found = (
        deltaio.unsafe_commits(options, environ)
        if deltaio.local_path(location) is None
        else unusable_location(location, options, environ)
    )
    if named is None:
        assert found is None
    else:
        assert found is not None and found.startswith(f"the {named}")
        assert "lets delta-rs commit without an exclusive write" in found


def test_a_ledger_on_an_unsafe_object_store_is_refused_before_it_is_touched() -> None:
    with pytest.raises(ConfigurationError) as refused:
        DeltaLedger("s3://bucket/ledger", storage_options=UNSAFE).open()
    message = str(refused.value)
    assert message.startswith(
        "ledger at s3://bucket/ledger: the storage option AWS_S3_ALLOW_UNSAFE_RENAME=true lets "
        "delta-rs commit without an exclusive write"
    )
    assert "s3-Secret-9" not in message


def test_a_delta_sink_on_an_unsafe_object_store_is_refused(
    tmp_path: Path,
) -> None:
    sink = {"type": "delta", "name": "bronze", "path": "s3://bucket/bronze",
            "storage_options": UNSAFE}  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", str(tmp_path / "ledger"), [sink])
    assert str(refused.value).startswith(
        "Delta sink 'bronze': option 'path': the storage option AWS_S3_ALLOW_UNSAFE_RENAME=true"
    )


def test_a_spool_on_an_unsafe_object_store_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    sink = {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"),
            "on_failure": "lag"}  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", str(tmp_path / "ledger"), [sink], spool="s3://bucket/spool")
    assert str(refused.value).startswith(
        "pipeline 'p': spool 's3://bucket/spool': the environment variable "
        "AWS_S3_ALLOW_UNSAFE_RENAME=true lets delta-rs"
    )


A_FILE = (
    "it is a file, not a directory: a Delta table is a directory; give the table's "
    "directory, or a path where nothing is yet to create one there"
)


def test_a_ledger_sink_or_spool_path_that_is_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    # delta-rs said "Invalid table location: Path does not exist" (a DeltaError, not a
    # FanoutError) for a path that exists: a file
    file = tmp_path / "orders.csv"
    file.write_text("id\n1\n")
    bronze = {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")}
    with pytest.raises(ConfigurationError) as ledger:
        FanOut("p", str(file), [bronze])
    assert str(ledger.value) == f"ledger at {file}: {A_FILE}"
    with pytest.raises(ConfigurationError) as sink:
        FanOut("p", str(tmp_path / "ledger"), [{**bronze, "path": str(file)}])
    assert str(sink.value) == f"Delta sink 'bronze': option 'path': {A_FILE}"
    with pytest.raises(ConfigurationError) as spool:
        FanOut("p", str(tmp_path / "ledger"), [{**bronze, "on_failure": "lag"}], spool=str(file))
    assert str(spool.value) == f"pipeline 'p': spool {str(file)!r}: {A_FILE}"
    assert file.read_text() == "id\n1\n"


@pytest.mark.parametrize("role", ["sink path", "dead_letter", "ledger"])
def test_a_table_under_a_file_is_refused_when_the_fanout_is_built(
    tmp_path: Path, role: str
) -> None:
    """A Delta location under a file (a mistyped mount, a path into a file) built fine and
    failed at the first write: a sink's first batch, or, for a dead-letter table, the
    first refused row, perhaps weeks later (``SinkWriteError: ... TableNotFoundError:
    Could not create local directory``, the dead letter not named); a ledger failed with a
    ``LedgerError`` (exit 1, not 2). Now each is a ConfigurationError at ``FanOut(...)``."""
    (tmp_path / "notes.txt").write_text("a file")
    under = tmp_path / "notes.txt" / "more" / "t"
    sink: dict[str, object] = {"type": "delta", "name": "bronze", "path": str(tmp_path / "t")}
    ledger = tmp_path / "ledger"
    if role == "sink path":
        sink["path"] = str(under)
    elif role == "dead_letter":
        sink.update(mode="merge", keys=["id"], dead_letter=str(under))
    else:
        ledger = under
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", str(ledger), [sink])
    where = {
        "sink path": "Delta sink 'bronze': option 'path'",
        "dead_letter": f"sink 'bronze': dead_letter {str(under)!r}",
        "ledger": f"ledger at {under}",
    }[role]
    assert str(refused.value) == (
        f"{where}: {str(tmp_path / 'notes.txt')!r} is a file, so no directory can be created "
        "under it; give a path under a directory"
    )
    assert (tmp_path / "notes.txt").read_text() == "a file"
    assert not (tmp_path / "t").exists()  # the sink's table was not created


def test_a_file_url_under_a_file_is_refused_and_object_store_uris_are_not_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check of a location under a file reads a ``file:`` URL as delta-rs does (its
    decoded path), and never looks an object store's URI up on the local disk (no
    ``os.stat``: a bucket named like a local file must not be refused)."""
    (tmp_path / "notes.txt").write_text("a file")
    url = f"file://{tmp_path}/notes.txt/t"
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", str(tmp_path / "ledger"), [{"type": "delta", "name": "b", "path": url}])
    assert str(refused.value) == (
        f"Delta sink 'b': option 'path': {str(tmp_path / 'notes.txt')!r} is a file, so no "
        "directory can be created under it; give a path under a directory"
    )

    def no_stat(path: object, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"looked up on the local disk: {path!r}")

    monkeypatch.setattr(os, "stat", no_stat)
    for uri in ("s3://b/notes.txt/t", "abfss://c@a.dfs.core.windows.net/t", "gs://b/t"):
        assert unusable_location(uri) is None
