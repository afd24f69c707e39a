"""The executors' append is taken only for a table whose every protocol feature and
``delta.*`` property its writer is known to handle; anything else is written by delta-rs
on the driver, logged once per sink. Binary partition columns are refused by engine rs.

Real Delta tables on the local disk, written without Spark: the sink runs the executors'
``FileWriter`` in this process (the code a Spark task runs) for an Arrow batch. A result
whose details carry ``write_from: executors`` was written by it; one without, by delta-rs.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import batch_of
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink

from fanout.contract.sink import SinkContext
from fanout.delta_tables.io import read_delta
from fanout.errors import ConfigurationError, SchemaMismatchError

EXECUTORS_LOG = "fanout_delta.rs_executors"


def opened(path: Path, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), **{"write_from": "executors", **options})
    sink.open(SinkContext(pipeline="p"))
    return sink


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def table_rows(path: Path) -> list[dict[str, Any]]:
    return read_delta(str(path)).sort_by("id").to_pylist()


def last_stats(path: Path) -> dict[str, Any]:
    """The statistics of the one file the table's last commit added, as its log says."""
    commit = path / "_delta_log" / f"{DeltaTable(str(path)).version():020d}.json"
    actions = [json.loads(line) for line in commit.read_text().splitlines()]
    (add,) = [a["add"] for a in actions if "add" in a]
    return json.loads(add["stats"])  # type: ignore[no-any-return]


def step_backs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == EXECUTORS_LOG and "writing from the driver" in r.getMessage()]  # fmt: skip


def local_times(ids: list[int]) -> pa.Table:
    """``id`` and a ``TIMESTAMP_NTZ`` column ``t``: a table created with them has the
    reader and writer feature ``timestampNtz`` (protocol 3/7), and only it."""
    when = [datetime(2024, 1, i) for i in ids]
    return pa.table({"id": pa.array(ids, pa.int64()), "t": pa.array(when, pa.timestamp("us"))})


def test_a_feature_outside_the_allowlist_sends_the_append_to_the_driver(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A table of protocol 3/7 with the features ``timestampNtz`` (handled) and
    ``deletionVectors`` (not on the list) is written by delta-rs, logged once for the
    sink. The old check, a list of known-bad features, wrote it from the executors."""
    from deltalake.table import TableFeatures

    path = tmp_path / "t"
    write_deltalake(str(path), local_times([1]))
    DeltaTable(str(path)).alter.add_feature(
        [TableFeatures.DeletionVectors], allow_protocol_versions_increase=True
    )
    sink = opened(path)
    caplog.set_level(logging.INFO, logger=EXECUTORS_LOG)

    first = sink.write(batch_of(local_times([2, 3]), 0))
    second = sink.write(batch_of(local_times([4]), 1))

    assert "write_from" not in first.details and "write_from" not in second.details
    assert read_delta(str(path)).sort_by("id").to_pylist() == local_times([1, 2, 3, 4]).to_pylist()
    assert step_backs(caplog) == [
        "sink 's', batch 0: writing from the driver (delta-rs' writer; logged once for the "
        "sink): the executors' writer is not known to handle table feature deletionVectors"
    ]


@pytest.mark.parametrize("created_by", ["sink", "other writer"])
def test_a_delta_property_outside_the_allowlist_sends_the_append_to_the_driver(
    tmp_path: Path, created_by: str
) -> None:
    """``delta.dataSkippingNumIndexedCols = 1``: statistics of the first column only,
    which delta-rs' writer follows; the executors' writer states them for 32 columns.
    Whether the table exists or the sink creates it from its ``configuration``, the
    batch is written by delta-rs (the old check wrote both from the executors)."""
    path = tmp_path / "t"
    configuration = {"delta.dataSkippingNumIndexedCols": "1"}
    if created_by == "other writer":
        write_deltalake(str(path), rows([1]), configuration=configuration)
    sink = opened(path, configuration=configuration)

    result = sink.write(batch_of(rows([2, 3]), 0))

    assert "write_from" not in result.details
    start = [1] if created_by == "other writer" else []
    assert table_rows(path) == [{"id": i, "v": f"v{i}"} for i in (*start, 2, 3)]
    assert last_stats(path) == {"numRecords": 2, "minValues": {"id": 2}, "maxValues": {"id": 3},
                                "nullCount": {"id": 0}}  # fmt: skip


def test_known_features_and_properties_stay_on_the_executors(tmp_path: Path) -> None:
    """appendOnly, change data feed (writer version 4), log retention and the checkpoint
    interval do not change how a data file is written: the executors write the batch,
    and the change data feed reads its rows as inserts."""
    path = tmp_path / "t"
    configuration = {
        "delta.appendOnly": "true",
        "delta.enableChangeDataFeed": "true",
        "delta.logRetentionDuration": "interval 60 days",
        "delta.checkpointInterval": "20",
    }
    write_deltalake(str(path), rows([1]), configuration=configuration)
    sink = opened(path)

    result = sink.write(batch_of(rows([2, 3]), 0))

    assert result.details["write_from"] == "executors"
    assert table_rows(path) == [{"id": i, "v": f"v{i}"} for i in (1, 2, 3)]
    changes = pa.table(DeltaTable(str(path)).load_cdf(starting_version=1)).to_pylist()
    assert sorted((c["id"], c["v"], c["_change_type"]) for c in changes) == [
        (2, "v2", "insert"),
        (3, "v3", "insert"),
    ]


BINARY_FIX = "hex(b) AS b_hex"


def binary_rows() -> pa.Table:
    return pa.table({"id": pa.array([1], pa.int64()), "b": pa.array([b"a/b"], pa.binary())})


@pytest.mark.parametrize("write_from", ["executors", "driver"])
def test_a_binary_partition_column_is_refused_before_any_row_is_written(
    tmp_path: Path, write_from: str
) -> None:
    """delta-rs stores ``b'a/b'`` as the partition value ``\\u0061\\u002F\\u0062`` and reads
    it back so, as bytes, without an error: engine rs refuses the column at plan time and
    on the batch (the old code wrote it, from the driver)."""
    path = tmp_path / "t"
    sink = opened(path, partition_by=["b"], write_from=write_from)

    with pytest.raises(SchemaMismatchError) as planned:
        sink.check_schema(binary_rows().schema)
    with pytest.raises(SchemaMismatchError) as written:
        sink.write(batch_of(binary_rows(), 0))

    for error in (planned.value, written.value):
        assert error.sink == "s" and error.columns == ["b"]
        assert "partition column(s) 'b' are binary" in str(error)
        assert BINARY_FIX in str(error)
    assert written.value.batch_id == 0
    assert not path.exists()


def test_an_existing_table_partitioned_by_a_binary_column_is_refused_at_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t"
    write_deltalake(str(path), binary_rows(), partition_by=["b"])

    with pytest.raises(ConfigurationError) as raised:
        opened(path)

    message = str(raised.value)
    assert message.startswith(f"Delta sink 's': the existing table at {str(path)!r}: ")
    assert "partition column(s) 'b' are binary" in message and BINARY_FIX in message


@pytest.mark.parametrize(
    ("configuration", "reasons"),
    [
        ({"delta.feature.deletionVectors": "supported"}, ["table feature deletionVectors"]),
        ({"delta.randomizePrefixes": "true"}, ["table property delta.randomizePrefixes=true"]),
        ({"delta.minWriterVersion": "8"}, ["protocol version 1/8"]),
        (
            {"delta.appendOnly": "true", "delta.targetFileSize": "1mb"},
            ["table property delta.targetFileSize=1mb"],
        ),
    ],
)
def test_the_configuration_of_a_table_to_create_is_checked_against_the_allowlists(
    configuration: dict[str, str], reasons: list[str]
) -> None:
    from fanout.delta_tables.distributed import blockers

    assert blockers(None, None, rows([1]).schema, configuration) == reasons
