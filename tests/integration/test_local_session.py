"""What ``fanout.spark.local_session`` sets for speed on a small machine: Arrow batches to
Python bounded by rows only, the parallel garbage collector in the JVM, checkpoint files
renamed through Hadoop's FileSystem API (no ``readlink`` processes), and local files served
by fanout's file system (no ``chmod`` processes)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout.jvm.classes import classes_jar
from fanout.spark import (
    ARROW_MAX_BYTES_PER_BATCH,
    ARROW_UNCHECKED_BATCH_BYTES,
    CHECKPOINT_FILE_MANAGER,
    FILE_SYSTEM_CHECKPOINTS,
    NIO_LOCAL_FILE_SYSTEM,
    local_file_system_conf,
)

LOCAL_FS_DRIVER = Path(__file__).with_name("local_fs_driver.py")


@pytest.mark.integration
def test_arrow_batches_are_not_measured_row_by_row(spark: Any) -> None:
    # Spark skips its per-row size check only at exactly INT_MAX
    assert ARROW_UNCHECKED_BATCH_BYTES == 2147483647
    assert spark.conf.get(ARROW_MAX_BYTES_PER_BATCH) == "2147483647"


@pytest.mark.integration
def test_the_driver_jvm_runs_the_parallel_collector(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = sorted(str(bean.getName()) for bean in beans)
    assert names == ["PS MarkSweep", "PS Scavenge"]


def _stream(spark: Any, source: Path, checkpoint: Path) -> list[int]:
    """Run an availableNow query over ``source`` (one file a batch); the ids it saw."""
    seen: list[int] = []
    query = (
        spark.readStream.schema("id INT").option("maxFilesPerTrigger", 1).json(str(source))
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None
    return sorted(seen)


@pytest.mark.integration
def test_checkpoints_are_written_and_resumed_through_the_file_system_manager(
    spark: Any, tmp_path: Path
) -> None:
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == FILE_SYSTEM_CHECKPOINTS
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    for i in range(2):
        (source / f"{i}.json").write_text(f'{{"id": {i}}}\n')
    assert _stream(spark, source, checkpoint) == [0, 1]
    (source / "2.json").write_text('{"id": 2}\n')
    assert _stream(spark, source, checkpoint) == [2]  # resumed from the checkpoint
    for log in ("offsets", "commits"):
        names = sorted(p.name for p in (checkpoint / log).iterdir() if not p.name.startswith("."))
        assert names == ["0", "1", "2"]
        leftovers = [p.name for p in (checkpoint / log).iterdir() if p.name.endswith(".tmp")]
        assert leftovers == []  # every file renamed into place


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.integration
def test_local_files_are_served_by_fanouts_file_system_with_hadoops_permissions(
    spark: Any, tmp_path: Path
) -> None:
    jvm = spark.sparkContext._jvm
    hadoop = jvm.org.apache.hadoop.fs
    local = hadoop.FileSystem.get(
        jvm.java.net.URI("file:///"), spark.sparkContext._jsc.hadoopConfiguration()
    )
    assert local.getClass().getName() == NIO_LOCAL_FILE_SYSTEM
    assert local.getRawFileSystem().getClass().getName() == "fanout.hadoop.NioRawLocalFileSystem"
    assert hadoop.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration()) is not None

    data = tmp_path / "data.txt"
    out = local.create(hadoop.Path(f"file://{data}"), True)
    out.write(b"fanout")
    out.close()
    assert data.read_bytes() == b"fanout"
    # Hadoop's file default 666 under its umask 022, on the file and its checksum file
    assert _mode(data) == 0o644
    assert _mode(tmp_path / ".data.txt.crc") == 0o644

    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    local.setPermission(hadoop.Path(f"file://{data}"), permission(0o640))
    assert _mode(data) == 0o640
    local.mkdirs(hadoop.Path(f"file://{tmp_path}/a/b"))
    assert (_mode(tmp_path / "a"), _mode(tmp_path / "a" / "b")) == (0o755, 0o755)
    # a sticky bit goes through Hadoop's own call
    local.setPermission(hadoop.Path(f"file://{tmp_path}/a"), permission(0o1777))
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o1777


@pytest.mark.integration
def test_fanouts_classes_are_loaded_from_their_jar(spark: Any) -> None:
    # a jar, not the classes' folder: a JVM with a folder on its class path can neither
    # dump nor use a class-data-sharing archive (tests/cds.py)
    jar = classes_jar()
    assert jar is not None and jar.name.startswith("classes-") and jar.suffix == ".jar"
    assert spark.sparkContext.getConf().get("spark.driver.extraClassPath") == str(jar)
    loaded = spark.sparkContext._jvm.java.lang.Class.forName(NIO_LOCAL_FILE_SYSTEM)
    assert loaded.getProtectionDomain().getCodeSource().getLocation().getPath() == str(jar)


@pytest.mark.integration
def test_a_running_session_gets_no_file_system_setting_its_jvm_cannot_load(spark: Any) -> None:
    assert spark.sparkContext._jsc is not None
    assert local_file_system_conf() == {}


@pytest.mark.integration
def test_a_stream_with_a_local_checkpoint_runs_no_chmod(tmp_path: Path) -> None:
    """A driver of its own, whose PATH puts a logging ``chmod`` first."""
    real_chmod = shutil.which("chmod")
    assert real_chmod is not None
    tools = tmp_path / "bin"
    tools.mkdir()
    logging_chmod = tools / "chmod"
    logging_chmod.write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/chmod.log\nexec {real_chmod} "$@"\n'
    )
    logging_chmod.chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, str(LOCAL_FS_DRIVER), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "file_system": NIO_LOCAL_FILE_SYSTEM,
        "stock_chmods": 2,  # Hadoop's own: the file and its checksum file
        "ids": [0, 1, 2],
        "stream_chmods": 0,
    }
