"""The local path a location names (fanout.contract.locations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.contract.locations import command_location, local_path


@pytest.mark.parametrize(
    ("location", "path"),
    [
        ("/data/lake", "/data/lake"),
        ("relative/lake", "relative/lake"),
        ("file:/data/lake", "/data/lake"),
        ("file:///data/lake", "/data/lake"),
        ("file://localhost/data/lake", "/data/lake"),
        ("file:/data/my%20lake/ck", "/data/my lake/ck"),
        ("file:/data/a%23b", "/data/a#b"),
        ("file:/data/a#b", "/data/a"),  # where delta-rs puts such a table
        ("file:/data/a?b", "/data/a"),
        ("/data/my%20lake", "/data/my%20lake"),  # a plain path is taken as it is
        ("file:///", "/"),
    ],
)
def test_local_locations_name_their_path(location: str, path: str) -> None:
    assert local_path(location) == path


@pytest.mark.parametrize(
    "location",
    ["s3://bucket/lake", "abfss://c@a.dfs.core.windows.net/x", "hdfs://nn:8020/lake", "gs://b/k"],
)
def test_other_schemes_are_not_local(location: str) -> None:
    assert local_path(location) is None


def test_commands_name_a_relative_path_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert command_location("lake/ledger") == f"{tmp_path}/lake/ledger"
    assert command_location("./lake/../ledger/") == f"{tmp_path}/ledger"
    assert command_location("/data/lake") == "/data/lake"
    assert command_location("my lake/ledger") == f"'{tmp_path}/my lake/ledger'"  # a shell's word


@pytest.mark.parametrize(
    ("location", "shown"),
    [
        ("file:relative/lake", "file:relative/lake"),  # a URL is named as written
        ("file:///data/my%20lake", "file:///data/my%20lake"),
        ("s3://bucket/lake", "s3://bucket/lake"),
        ("abfss://c@a.dfs.core.windows.net/x", "abfss://c@a.dfs.core.windows.net/x"),
        ("s3://key:p%40ss@bucket/lake", "'s3://key:***@bucket/lake'"),  # never a secret
        ("s3://key:pa/ss?w#rd@bucket/lake", "'s3://key:***@bucket/lake'"),  # read to the '@'
        ("s3://bucket/dir:x@y", "s3://bucket/dir:x@y"),  # a ':' after the host: no password
    ],
)
def test_commands_name_a_url_as_written_without_its_password(location: str, shown: str) -> None:
    assert command_location(location) == shown
