"""What ``fanout.spark`` adds for a ``local-cluster`` master (no session started)."""

from __future__ import annotations

from fanout.spark import cluster_conf, cluster_master


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
