"""fanout.jvm.classes: fanout's Java sources compiled by Spark's Janino into a cache, once;
and every way it can fail leaves a session without the classes, never half of them."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fanout.jvm import classes
from fanout.jvm.classes import compiled_classes

CLASSES = ("NioLocalFileSystem.class", "NioRawLocalFileSystem.class")


def _class_files(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "fanout" / "hadoop").iterdir())


@pytest.mark.integration
def test_the_classes_compile_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = compiled_classes(tmp_path)
    assert first is not None
    assert first.parent == tmp_path and first.name.startswith("classes-")
    assert _class_files(first) == sorted(CLASSES)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no compile folder left

    def no_compiler(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert compiled_classes(tmp_path) == first


@pytest.mark.integration
def test_changed_sources_compile_into_a_folder_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = compiled_classes(tmp_path / "cache")
    sources = tmp_path / "sources"
    sources.mkdir()
    for source in sorted(classes.SOURCES.glob("*.java")):
        text = source.read_text()
        (sources / source.name).write_text(text.replace("/**", "/** A changed comment.", 1))
    monkeypatch.setattr(classes, "SOURCES", sources)
    second = compiled_classes(tmp_path / "cache")
    assert first is not None and second is not None
    assert second != first
    assert _class_files(second) == sorted(CLASSES)


@pytest.mark.integration
def test_a_compile_error_gives_no_classes_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "NioLocalFileSystem.java").write_text(
        "package fanout.hadoop;\npublic class NioLocalFileSystem { void f() { undefined(); } }\n"
    )
    monkeypatch.setattr(classes, "SOURCES", sources)
    with caplog.at_level(logging.WARNING, logger="fanout.jvm.classes"):
        assert compiled_classes(tmp_path / "cache") is None
    assert "not compiled (exit 1)" in caplog.text
    assert 'A method named "undefined" is not declared' in caplog.text
    assert list((tmp_path / "cache").iterdir()) == []  # its compile folder removed


@pytest.mark.integration
def test_no_java_or_no_janino_gives_no_classes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with monkeypatch.context() as patch, caplog.at_level(logging.INFO, "fanout.jvm.classes"):
        patch.setattr(classes, "_java", lambda: None)
        assert compiled_classes(tmp_path) is None
    assert "not compiled: no java" in caplog.text
    caplog.clear()
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "hadoop-client-api-3.5.0.jar").write_bytes(b"")
    (jars / "commons-compiler-jdk-3.1.9.jar").write_bytes(b"")  # not the one it needs
    with monkeypatch.context() as patch, caplog.at_level(logging.INFO, "fanout.jvm.classes"):
        patch.setattr(classes, "spark_jars", lambda: jars)
        assert compiled_classes(tmp_path / "cache") is None
    assert f"{jars} lacks Janino or Hadoop's API" in caplog.text
    assert not (tmp_path / "cache").exists()


@pytest.mark.integration
def test_an_unwritable_cache_compiles_into_a_private_folder(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    found = compiled_classes(blocked / "cache")
    assert found is not None
    assert blocked not in found.parents
    assert _class_files(found) == sorted(CLASSES)
    assert found.stat().st_mode & 0o077 == 0  # readable by this user only
    shutil.rmtree(found)
