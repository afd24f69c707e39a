"""fanout's classes jar (fanout.jvm.classes.jarred/classes_jar) and the tests' class-data-
sharing archive (tests/cds.py): the jar holds the classes, appears whole or not at all and
is reused; the archive option is given only when the archive file exists, and a dump that
fails or hangs leaves no archive (no Java here: fake class files, a fake dump command)."""

from __future__ import annotations

import os
import stat
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

import tests.cds as cds
from fanout.jvm import classes
from fanout.jvm.classes import classes_jar, jarred

BASE = "-XX:TieredStopAtLevel=1"


def _classes(root: Path) -> Path:
    folder = root / "classes-0123456789abcdef"
    (folder / "fanout" / "hadoop").mkdir(parents=True)
    (folder / "fanout" / "hadoop" / "NioLocalFileSystem.class").write_bytes(b"\xca\xfe\x00one")
    (folder / "fanout" / "hadoop" / "NioRawLocalFileSystem.class").write_bytes(b"\xca\xfetwo")
    return folder


def test_the_jar_holds_the_classes_beside_their_folder(tmp_path: Path) -> None:
    folder = _classes(tmp_path)
    jar = jarred(folder)
    assert jar == tmp_path / "classes-0123456789abcdef.jar"
    with zipfile.ZipFile(jar) as archive:
        assert sorted(archive.namelist()) == [
            "fanout/hadoop/NioLocalFileSystem.class",
            "fanout/hadoop/NioRawLocalFileSystem.class",
        ]
        assert archive.read("fanout/hadoop/NioLocalFileSystem.class") == b"\xca\xfe\x00one"
        assert archive.read("fanout/hadoop/NioRawLocalFileSystem.class") == b"\xca\xfetwo"
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name, jar.name]  # no temp


def test_a_jar_already_there_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _classes(tmp_path)
    jar = jarred(folder)
    before = jar.stat()

    def no_writing(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("written again")

    monkeypatch.setattr(tempfile, "mkstemp", no_writing)
    assert jarred(folder) == jar
    assert jar.stat().st_ino == before.st_ino and jar.stat().st_mtime_ns == before.st_mtime_ns


def test_a_jar_lacking_a_class_is_replaced(tmp_path: Path) -> None:
    folder = _classes(tmp_path)
    jar = tmp_path / f"{folder.name}.jar"
    with zipfile.ZipFile(jar, "w") as half:
        half.writestr("fanout/hadoop/NioLocalFileSystem.class", b"\xca\xfe\x00one")
    assert jarred(folder) == jar
    with zipfile.ZipFile(jar) as archive:
        assert len(archive.namelist()) == 2
        assert archive.read("fanout/hadoop/NioRawLocalFileSystem.class") == b"\xca\xfetwo"


def test_a_jar_failing_part_way_leaves_none_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _classes(tmp_path)
    written: list[str] = []
    original = zipfile.ZipFile.write

    def second_fails(self: zipfile.ZipFile, path: Any, name: Any = None, *args: Any) -> None:
        if written:
            raise OSError(28, "No space left on device")
        written.append(str(name))
        original(self, path, name, *args)

    monkeypatch.setattr(zipfile.ZipFile, "write", second_fails)
    with pytest.raises(OSError, match="No space left"):
        jarred(folder)
    assert written == ["fanout/hadoop/NioLocalFileSystem.class"]  # it did fail part way
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_classes_jar_gives_the_jar_the_folder_when_unwritable_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _classes(tmp_path)
    monkeypatch.setattr(classes, "compiled_classes", lambda cache=None: folder)
    assert classes_jar() == tmp_path / f"{folder.name}.jar"
    (tmp_path / f"{folder.name}.jar").unlink()
    os.chmod(tmp_path, stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(tmp_path, os.W_OK):  # root writes anyway: fail the temporary file
            monkeypatch.setattr(tempfile, "mkstemp", _unwritable)
        assert classes_jar() == folder
    finally:
        os.chmod(tmp_path, stat.S_IRWXU)
    monkeypatch.setattr(classes, "compiled_classes", lambda cache=None: None)
    assert classes_jar() is None


def _unwritable(*args: Any, **kwargs: Any) -> Any:
    raise PermissionError(13, "Permission denied")


def test_the_archive_option_only_when_the_file_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "tests-cds-0123.jsa"
    monkeypatch.setattr(cds, "archive_path", lambda options: archive)
    env = {"SPARK_SUBMIT_OPTS": BASE}
    cds.with_archive(env, BASE, ["tests/unit"])  # a unit-only run does not dump
    assert env == {"SPARK_SUBMIT_OPTS": BASE}
    assert not archive.exists()

    def failing(archive: Path, options: str) -> str:
        return "the dump run exited 1: no java"

    monkeypatch.setattr(cds, "dumped", failing)
    cds.with_archive(env, BASE, ["tests/integration/test_hard_kill.py"])
    assert env == {"SPARK_SUBMIT_OPTS": BASE}

    def dumping(archive: Path, options: str) -> str:
        assert options == BASE
        archive.write_bytes(b"archive")
        return ""

    monkeypatch.setattr(cds, "dumped", dumping)
    theirs = {"SPARK_SUBMIT_OPTS": "-Xmx1g"}  # the user's own options: left alone
    cds.with_archive(theirs, BASE, [])
    assert theirs == {"SPARK_SUBMIT_OPTS": "-Xmx1g"} and not archive.exists()
    cds.with_archive(env, BASE, [])
    assert env == {
        "SPARK_SUBMIT_OPTS": f"{BASE} -XX:SharedArchiveFile={archive} "
        "-Xlog:cds=off -Xlog:cds+dynamic=off"
    }
    unit = {"SPARK_SUBMIT_OPTS": BASE}  # an archive there serves unit-only runs too
    cds.with_archive(unit, BASE, ["tests/unit/test_cli.py::test_x"])
    assert unit == env


def test_a_dump_removes_the_archives_no_run_used_lately_and_a_run_keeps_its_own_fresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    day = 24 * 3600.0
    now = 100 * day
    archive = tmp_path / "tests-cds-new.jsa"
    stale = tmp_path / "tests-cds-old.jsa"
    recent = tmp_path / "tests-cds-other-venv.jsa"
    unrelated = tmp_path / "classes-0123.jar"
    for path, age in ((stale, 15 * day), (recent, 13 * day), (unrelated, 30 * day)):
        path.write_bytes(b"x")
        os.utime(path, (now - age, now - age))
    stale.with_name(f"{stale.name}.lock").write_text("")
    assert cds.remove_stale(archive, now=now) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "classes-0123.jar",
        "tests-cds-other-venv.jsa",
    ]

    monkeypatch.setattr(cds, "archive_path", lambda options: archive)
    archive.write_bytes(b"archive")
    os.utime(archive, (now, now))
    cds.archive_options(BASE, dump=False)  # used: touched
    assert archive.stat().st_mtime > time.time() - 600


def test_no_archive_path_or_an_error_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cds, "archive_path", lambda options: None)
    env = {"SPARK_SUBMIT_OPTS": BASE}
    cds.with_archive(env, BASE, [])
    assert env == {"SPARK_SUBMIT_OPTS": BASE}

    def broken(options: str) -> Path:
        raise RuntimeError("no pyspark")

    monkeypatch.setattr(cds, "archive_path", broken)
    cds.with_archive(env, BASE, [])
    assert env == {"SPARK_SUBMIT_OPTS": BASE}
    assert "no class-data-sharing archive (RuntimeError('no pyspark'))" in capsys.readouterr().err


def _fake_dump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """``sys.executable`` for the dump's command: a shell script given the temporary
    archive's path as its third argument (``python -m tests.cds <path>``)."""
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cds.sys, "executable", str(fake))


def test_a_dump_timing_out_leaves_no_archive_and_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "cache" / "tests-cds-0123.jsa"
    archive.parent.mkdir()
    _fake_dump(tmp_path, monkeypatch, 'printf half > "$3"; sleep 30')
    assert cds.dumped(archive, BASE, timeout=1.0) == "the dump run took over 1 s"
    assert sorted(p.name for p in archive.parent.iterdir()) == ["tests-cds-0123.jsa.lock"]


def test_a_dump_failing_says_how_and_a_whole_one_is_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "cache" / "tests-cds-0123.jsa"
    archive.parent.mkdir()
    _fake_dump(tmp_path, monkeypatch, 'printf half > "$3"; echo "no java here"; exit 3')
    assert cds.dumped(archive, BASE) == "the dump run exited 3: no java here"
    assert sorted(p.name for p in archive.parent.iterdir()) == ["tests-cds-0123.jsa.lock"]
    script = (
        'case "$SPARK_SUBMIT_OPTS" in *"-XX:ArchiveClassesAtExit=$3") printf whole > "$3";; esac'
    )
    _fake_dump(tmp_path, monkeypatch, script)
    assert cds.dumped(archive, BASE) == ""
    assert archive.read_bytes() == b"whole"
    assert sorted(p.name for p in archive.parent.iterdir()) == [
        archive.name,
        f"{archive.name}.lock",
    ]
    _fake_dump(tmp_path, monkeypatch, "exit 9")  # there: not dumped again
    assert cds.dumped(archive, BASE) == ""
    assert archive.read_bytes() == b"whole"
