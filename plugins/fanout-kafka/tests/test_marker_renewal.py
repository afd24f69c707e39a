"""A run commits the Kafka sink's marker groups again at its first batch
(:mod:`fanout_kafka.renewal`), so the brokers' ``offsets.retention.minutes`` counts from
the run's start, not from the last batch that wrote rows.

Tansu keeps committed offsets for ever (it has no ``offsets.retention.minutes``), so the
renewal is seen where it happens: the driver's renewal producers are wrapped to record
each group and offset they send and whether their transaction committed, and the broker's
offsets are read back with a consumer of each group."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest
from fanout_kafka import renewal
from kafkatools import Broker, marker

from fanout import BatchInfo, FanOut

SUFFIXES = ("", ".plan", ".target")
"""The groups a partition's transaction commits without dead letters or a route."""


class _Spied:
    """A renewal producer: what it sent to its transaction, and what it committed."""

    def __init__(self, config: dict[str, Any], log: list[_Spied], groups: dict[int, str]) -> None:
        self._inner = confluent_kafka.Producer(config)
        self.transactional_id = str(config["transactional.id"])
        self.sent: list[tuple[str, int]] = []
        self.committed: dict[str, int] | None = None
        self._groups = groups
        log.append(self)

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self._inner.send_offsets_to_transaction(offsets, metadata, timeout)
        self.sent += [(self._groups[id(metadata)], tp.offset) for tp in offsets]

    def commit_transaction(self, timeout: float) -> None:
        self._inner.commit_transaction(timeout)
        self.committed = dict(self.sent)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.fixture
def renewals(monkeypatch: pytest.MonkeyPatch) -> list[_Spied]:
    """Every renewal producer the driver makes, in order."""
    log: list[_Spied] = []
    groups: dict[int, str] = {}
    real = renewal.group_metadata

    def metadata(settings: Any, partition: int, group: str) -> Any:
        made = real(settings, partition, group)
        groups[id(made)] = group
        return made

    monkeypatch.setattr(renewal, "group_metadata", metadata)
    monkeypatch.setattr(renewal, "Producer", lambda config: _Spied(config, log, groups))
    return log


def _groups(kafka: Broker, pipeline: str, marker_topic: str) -> dict[str, int]:
    """The offsets of partitions 0 and 1's marker, plan and target groups on the broker."""
    return {
        f"fanout/{pipeline}/k/p{p}{suffix}": marker(kafka.bootstrap, pipeline, "k", p,
                                                      marker_topic, suffix=suffix)
        for p in (0, 1) for suffix in SUFFIXES
    }  # fmt: skip


def test_a_run_commits_the_markers_it_finds_again_at_its_first_batch_only(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, renewals: list[_Spied]
) -> None:
    pipeline = f"renew{uuid.uuid4().hex[:6]}"
    markers = f"{topic}-markers"
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap, "topic": topic,
            "key": "id", "partitions": 2, "marker_topic": markers}  # fmt: skip
    rows = spark.createDataFrame([(i,) for i in range(8)], "id BIGINT")

    first = FanOut(pipeline, str(tmp_path / "ledger"), [sink])
    try:
        first.process(rows, BatchInfo(pipeline, 0, "q"))
    finally:
        first.close()
    assert renewals == []  # a new scope: no marker, no producer
    before = _groups(kafka, pipeline, markers)
    assert [before[f"fanout/{pipeline}/k/p{p}"] for p in (0, 1)] == [1, 1]  # batch 0's
    assert all(offset >= 0 for offset in before.values()), before

    second = FanOut(pipeline, str(tmp_path / "ledger"), [sink])
    try:
        second.process(rows, BatchInfo(pipeline, 1, "q"))
        assert sorted(r.transactional_id for r in renewals) == [
            f"fanout/{pipeline}/k-0",
            f"fanout/{pipeline}/k-1",
        ]
        committed = {g: o for r in renewals for g, o in (r.committed or {}).items()}
        assert committed == before  # every group, at the offset it held, before batch 1
        second.process(rows, BatchInfo(pipeline, 2, "q"))
        assert len(renewals) == 2  # once per open(): nothing per batch
    finally:
        second.close()
    after = _groups(kafka, pipeline, markers)
    assert [after[f"fanout/{pipeline}/k/p{p}"] for p in (0, 1)] == [3, 3]


@pytest.mark.parametrize("tansu", [True, False])
def test_a_renewal_that_fails_is_logged_and_on_tansu_its_ids_ended_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tansu: bool
) -> None:
    """Writer ``-0`` fails, ``-1`` has no marker (never asked), ``-2`` renews: the batch goes
    on; on Tansu the failed writer's id is initialised again before the markers are read
    (its transaction, if left open, would hold other markers back)."""
    writers = [renewal.Writer(f"t-{p}", f"g{p}") for p in range(3)]
    monkeypatch.setattr(renewal, "writers", lambda settings, span: writers)
    monkeypatch.setattr(renewal, "read_offsets", lambda *a: [5, renewal.NO_OFFSET, 7])
    asked: list[str] = []

    def renew(settings: Any, writer: renewal.Writer) -> Any:
        asked.append(writer.transactional_id)
        if writer.transactional_id == "t-0":
            return confluent_kafka.KafkaException(confluent_kafka.KafkaError(-185, "down"))
        return {writer.marker: 7}

    ended: list[list[str]] = []

    def end(settings: Any, partitions: int, batch_id: int, **kw: Any) -> None:
        ended.append(kw["extra_ids"])

    monkeypatch.setattr(renewal, "_renew", renew)
    monkeypatch.setattr(renewal, "end_abandoned_transactions", end)
    settings = SimpleNamespace(producer={}, bootstrap_servers="b:1", operation_timeout_s=1.0,
                               marker_topic="m", sink="k",
                               end_turns="/tmp/turns" if tansu else None)  # fmt: skip
    done = renewal.renew_markers(settings, 3, 4)  # type: ignore[arg-type]
    assert (sorted(asked), done.renewed, done.failed) == (["t-0", "t-2"], {"g2": 7}, ("t-0",))
    assert ended == ([["t-0"]] if tansu else [])
    assert [r.levelname for r in caplog.records if "t-0" in r.getMessage()] == ["WARNING"]
