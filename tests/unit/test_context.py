"""Step 1 of a batch: the checkpoint's ``offsets/N`` file and the batch context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fanout.contract.batch import BatchInfo
from fanout.steps.context import (
    ContextReader,
    PlannedBatch,
    parse_offset_file,
    parse_offset_log,
    pyarrow_uri,
    query_id_of,
    read_checkpoint_file,
)

# As Spark writes offsets/<N>: a version line, the batch metadata, one line per source
# (a Kafka source, a source without an offset yet, a file source).
OFFSETS = (
    "v1\n"
    '{"batchWatermarkMs":0,"batchTimestampMs":1732166400000,"conf":{'
    '"spark.sql.streaming.stateStore.providerClass":"org.apache.spark.sql.execution.streaming.'
    'state.HDFSBackedStateStoreProvider","spark.sql.shuffle.partitions":"200"}}\n'
    '{"topic":{"0":42}}\n'
    "-\n"
    '{"logOffset":7}'
)


def test_parse_offset_file() -> None:
    assert parse_offset_file(OFFSETS) == [{"topic": {"0": 42}}, None, {"logOffset": 7}]


def test_parse_offset_log_reads_the_planning_time() -> None:
    """A crash replay reads the same offsets/N, planning time included; a re-planned
    batch gets a new one: the guard compares it with the ledger's."""
    assert parse_offset_log(OFFSETS) == PlannedBatch(
        [{"topic": {"0": 42}}, None, {"logOffset": 7}], 1732166400000
    )


@pytest.mark.parametrize(
    "metadata", ['{"batchWatermarkMs":0}', '{"batchTimestampMs":"soon"}', "not json", "[1]"]
)
def test_parse_offset_log_without_a_planning_time(metadata: str) -> None:
    assert parse_offset_log(f'v1\n{metadata}\n{{"logOffset":3}}\n') == PlannedBatch(
        [{"logOffset": 3}], None
    )


def test_parse_offset_file_two_sources_multi_partition() -> None:
    text = 'v1\n{"batchWatermarkMs":0}\n{"orders":{"1":17,"0":42},"refunds":{"0":3}}\n-\n'
    parsed = parse_offset_file(text)
    assert parsed == [{"orders": {"0": 42, "1": 17}, "refunds": {"0": 3}}, None]
    # round-trips to the JSON the ledger stores
    assert json.loads(json.dumps(parsed)) == parsed


def test_parse_offset_file_without_sources() -> None:
    assert parse_offset_file('v1\n{"batchWatermarkMs":0}\n') == []


@pytest.mark.parametrize("text", ["", "garbage", '{"topic":{"0":42}}\n-', "\nv1\n{}"])
def test_parse_offset_file_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_offset_file(text)
    assert str(raised.value) == "not a Spark offset log file (no version line)"


def test_parse_offset_file_rejects_bad_json() -> None:
    with pytest.raises(json.JSONDecodeError):
        parse_offset_file("v1\n{}\n{not json")


class NotSpark:
    """A DataFrame-like object without a Spark session."""


def test_context_reader_outside_spark(caplog: pytest.LogCaptureFixture) -> None:
    reader = ContextReader("orders")
    assert query_id_of(NotSpark()) is None
    assert reader.read(NotSpark(), 3) == BatchInfo("orders", 3, None, None)
    assert reader.read(NotSpark(), 4) == BatchInfo("orders", 4, None, None)
    warnings = [r for r in caplog.records if "cannot read source offsets" in r.getMessage()]
    assert len(warnings) == 1  # warned once, not per batch
    assert "checkpoint location unknown" in warnings[0].getMessage()


class _NoHadoop:
    """A classic session whose JVM must not be asked (a ``file:`` root is read in Python)."""

    @property
    def sparkContext(self) -> object:
        raise AssertionError("read through Hadoop")


def test_a_file_root_is_read_without_hadoop(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    (root / "offsets").mkdir(parents=True)
    (root / "offsets" / "5").write_text(OFFSETS)
    for location in (f"file:{root}", f"file://{root}"):
        assert read_checkpoint_file(_NoHadoop(), location, "offsets/5") == OFFSETS
        assert read_checkpoint_file(_NoHadoop(), location, "offsets/6") is None
    # without a scheme, Hadoop's default filesystem decides what the path means
    with pytest.raises(AssertionError, match="read through Hadoop"):
        read_checkpoint_file(_NoHadoop(), str(root), "offsets/5")


def test_a_file_root_is_taken_literally_as_hadoop_writes_it(tmp_path: Path) -> None:
    # Spark resolves "/tmp/my dir" to file:/tmp/my dir (Hadoop's Path, not a URL): no
    # escapes, so a "%20" in a directory name is part of the name
    root = tmp_path / "my dir #1 100%20" / "ck"
    (root / "offsets").mkdir(parents=True)
    (root / "offsets" / "5").write_text(OFFSETS)
    for location in (f"file:{root.as_posix()}", f"file://{root.as_posix()}"):
        assert read_checkpoint_file(_NoHadoop(), location, "offsets/5") == OFFSETS


@pytest.mark.parametrize(
    ("location", "named"),
    [
        ("s3a://bucket/ck/offsets/5", "s3://bucket/ck/offsets/5"),
        ("S3N://bucket/ck", "s3://bucket/ck"),
        ("s3://bucket/ck", "s3://bucket/ck"),
        ("gs://bucket/ck", "gs://bucket/ck"),
        ("abfss://c@a.dfs.core.windows.net/ck", "abfss://c@a.dfs.core.windows.net/ck"),
    ],
)
def test_hadoops_s3_schemes_are_read_as_pyarrows(location: str, named: str) -> None:
    assert pyarrow_uri(location) == named
