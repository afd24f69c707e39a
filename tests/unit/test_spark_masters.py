"""What ``fanout.spark`` adds for a ``local-cluster`` master, and how the caller's settings
join its own (no session started)."""

from __future__ import annotations

import os

import pytest

import fanout.spark
from fanout.spark import _merged, cluster_conf, cluster_master, master_settings


def test_cluster_master_spells_local_cluster() -> None:
    assert cluster_master() == "local-cluster[2,1,1024]"
    assert cluster_master(3, 2, 512) == "local-cluster[3,2,512]"


def test_a_local_cluster_gets_its_workers_memory_and_task_retries() -> None:
    assert cluster_conf("local-cluster[2, 1, 768]") == {
        "spark.executor.memory": "768m",
        "spark.task.maxFailures": "4",
        "spark.deploy.maxExecutorRetries": "100",
    }


def test_other_masters_get_nothing() -> None:
    for master in ("local[2]", "local[*]", "spark://host:7077", "yarn", ""):
        assert cluster_conf(master) == {}


def test_the_callers_settings_win_and_class_paths_join() -> None:
    ours = {
        "spark.hadoop.fs.file.impl": "fanout.hadoop.NioLocalFileSystem",
        "spark.driver.extraClassPath": "/cache/classes",
        "spark.executor.extraClassPath": "/cache/classes",
        "spark.task.maxFailures": "4",
    }
    theirs = {
        "spark.driver.extraClassPath": "/opt/their.jar",
        "spark.task.maxFailures": "1",
        "spark.sql.shuffle.partitions": "8",
    }
    assert _merged(ours, theirs) == {
        "spark.hadoop.fs.file.impl": "fanout.hadoop.NioLocalFileSystem",
        "spark.driver.extraClassPath": f"/opt/their.jar{os.pathsep}/cache/classes",
        "spark.executor.extraClassPath": "/cache/classes",
        "spark.task.maxFailures": "1",
        "spark.sql.shuffle.partitions": "8",
    }
    assert _merged({}, theirs) == theirs


def test_only_masters_on_this_machine_get_fanouts_local_file_system(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = {"spark.hadoop.fs.file.impl": "fanout.hadoop.NioLocalFileSystem"}
    monkeypatch.setattr(fanout.spark, "local_file_system_conf", lambda: dict(ours))
    for master in ("local", "local[2]", "local[*]", " local[4,2]"):
        assert master_settings(master) == ours
    assert master_settings("local-cluster[2,1,512]") == {
        **cluster_conf("local-cluster[2,1,512]"),
        **ours,
    }
    # executors elsewhere would not find the classes; None is whatever spark-submit says
    for other in ("spark://host:7077", "yarn", "k8s://https://host:443", None):
        assert master_settings(other) == {}
