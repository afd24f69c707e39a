"""A run commits the Kafka sink's marker groups again at its first batch, and at a later
batch once that renewal is half the brokers' ``offsets.retention.minutes`` old
(:mod:`fanout_kafka.renewal`), so the retention counts from the run's start and then from
the last renewal, not from the last batch that wrote rows.

Tansu keeps committed offsets for ever (it has no ``offsets.retention.minutes``), so the
renewal is seen where it happens: the driver's renewal producers are wrapped to record
each group and offset they send and whether their transaction committed, and the broker's
offsets are read back with a consumer of each group."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException
from fanout_kafka import KafkaSink, renewal
from fanout_kafka import sink as sink_module
from kafkatools import Broker, WrappedProducer, create_topic, marker
from test_abandoned_transactions import PLAN, _batch, _commit, _sink

from fanout import BatchInfo, FanOut
from fanout.contract.sink import SinkContext
from fanout.errors import TransientSinkError

SUFFIXES = ("", ".plan", ".target")
"""The groups a partition's transaction commits without dead letters or a route."""


class _Spied:
    """A renewal producer: what it sent to its transaction, and what it committed."""

    def __init__(self, config: dict[str, Any], log: list[_Spied], groups: dict[int, str]) -> None:
        self._inner = confluent_kafka.Producer(config)
        self.transactional_id = str(config["transactional.id"])
        self.sent: list[tuple[str, int]] = []
        self.committed: dict[str, int] | None = None
        self.closed = False
        self.refused: Exception | None = None  # what its init_transactions raises, if set
        self._groups = groups
        log.append(self)

    def init_transactions(self, timeout: float) -> None:
        if self.refused is not None:
            raise self.refused
        self._inner.init_transactions(timeout)

    def close(self) -> bool:
        self.closed = True
        return bool(self._inner.close())

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
def test_a_renewal_that_fails_is_logged_and_the_ids_it_may_have_left_open_ended_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tansu: bool
) -> None:
    """Writer ``-0`` fails before its transaction, ``-1`` has no marker (never asked),
    ``-2`` renews, ``-3`` fails leaving its transaction open: the batch goes on; the id of
    ``-3`` is initialised again before the markers are read on every broker (left open, it
    holds the marker reads back), and on Tansu that of ``-0`` too (an open transaction of
    its id, from before the renewal, would hold other markers back)."""
    writers = [renewal.Writer(f"t-{p}", f"g{p}") for p in range(4)]
    monkeypatch.setattr(renewal, "writers", lambda settings, span: writers)
    monkeypatch.setattr(renewal, "read_offsets", lambda *a: [5, renewal.NO_OFFSET, 7, 8])
    asked: list[str] = []

    def renew(settings: Any, writer: renewal.Writer, secrets: Any) -> Any:
        asked.append(writer.transactional_id)
        if writer.transactional_id in ("t-0", "t-3"):
            return renewal._Failed("down", left_open=writer.transactional_id == "t-3")
        return {writer.marker: 7}

    ended: list[list[str]] = []

    def end(settings: Any, ids: list[str]) -> dict[str, Any]:
        ended.append(ids)
        return {}

    monkeypatch.setattr(renewal, "_renew", renew)
    monkeypatch.setattr(renewal, "end_transactions", end)
    settings = SimpleNamespace(producer={}, bootstrap_servers="b:1", operation_timeout_s=1.0,
                               marker_topic="m", sink="k",
                               end_turns="/tmp/turns" if tansu else None)  # fmt: skip
    done = renewal.renew_markers(settings, 4, 4)  # type: ignore[arg-type]
    assert (sorted(asked), done.renewed, done.failed) == (
        ["t-0", "t-2", "t-3"], {"g2": 7}, ("t-0", "t-3")
    )  # fmt: skip
    assert ended == ([["t-0", "t-3"]] if tansu else [["t-3"]])
    assert [r.levelname for r in caplog.records if "t-0" in r.getMessage()] == ["WARNING"]


SECRET = "pw-7Qx!renewal"


def test_a_renewal_that_fails_closes_its_producers_ends_what_it_left_open_and_hides_secrets(
    kafka: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a broker without Tansu's turns (as Kafka): partition 0's renewal begins its
    transaction (its offsets moved on by 100 here, to be seen if they ever apply) and
    neither commits nor aborts it (the brokers' text holding a password), partition 1's
    fails before its transaction with an error that is not Kafka's. The batch goes on;
    both producers are closed; partition 0's id is initialised again, which ends that
    transaction (the renewal's producer cannot commit it any more: the marker stays), and
    partition 1's is not; the warnings hold no password."""
    topic, pipeline = f"rn-{uuid.uuid4().hex[:8]}", f"rn{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    sink = _sink(kafka, topic, pipeline)
    assert sink.committed_partitions(_batch(pipeline), PLAN) == []
    _commit(sink, pipeline, 0, 0)
    _commit(sink, pipeline, 1, 0)
    settings = replace(sink.settings(_batch(pipeline, 1)), end_turns=None,
                       producer={"sasl.password": SECRET})  # fmt: skip
    prefix = f"fanout/{pipeline}/events"
    made: list[Any] = []

    class Failing(WrappedProducer):
        """A renewal producer whose commit and abort the brokers refuse."""

        def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
            moved = [confluent_kafka.TopicPartition(o.topic, 0, o.offset + 100) for o in offsets]
            self.inner.send_offsets_to_transaction(moved, metadata, timeout)

        def commit_transaction(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._STATE, f"refused for {SECRET}"))

        def abort_transaction(self, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._STATE, "cannot abort"))

    real_read = renewal.read_offsets

    def read(config: Any, topic_: str, groups: list[str], timeout_s: float) -> list[int]:
        if groups[0] == f"fanout/{pipeline}/events/p1" and len(groups) > 1:  # its own read
            raise RuntimeError(f"no offsets for {SECRET}")
        return real_read(config, topic_, groups, timeout_s)

    ended: list[list[str]] = []
    real_end = renewal.end_transactions

    def end(settings_: Any, ids: list[str]) -> Any:
        ended.append(sorted(ids))
        return real_end(settings_, ids)

    monkeypatch.setattr(renewal, "Producer", lambda config: Failing(config, made))
    monkeypatch.setattr(renewal, "read_offsets", read)
    monkeypatch.setattr(renewal, "end_transactions", end)
    with caplog.at_level(logging.DEBUG, "fanout_kafka"):
        done = renewal.renew_markers(settings, 2, 1)
    try:
        assert (done.renewed, sorted(done.failed)) == ({}, [f"{prefix}-0", f"{prefix}-1"])
        assert sorted((m.transactional_id, m.closed) for m in made) == [
            (f"{prefix}-0", True), (f"{prefix}-1", True)
        ]  # fmt: skip
        assert ended == [[f"{prefix}-0"]]
        left = next(m for m in made if m.transactional_id == f"{prefix}-0")
        with pytest.raises(KafkaException):  # its transaction was ended under it
            left.inner.commit_transaction(5)
        assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 1
    finally:
        for m in made:  # closing waits for an open transaction's end: one try first
            with contextlib.suppress(KafkaException):
                m.inner.commit_transaction(1)
            with warnings.catch_warnings():  # "abort_transaction failed during close"
                warnings.simplefilter("ignore", RuntimeWarning)
                m.inner.close()
    warned = sorted(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert warned == [
        f"sink 'events', batch 1: cannot commit the marker groups of '{prefix}-0' again "
        "(their retention is not extended: tried again at the next batch): "
        + str(KafkaException(KafkaError(KafkaError._STATE, "refused for ***"))),
        f"sink 'events', batch 1: cannot commit the marker groups of '{prefix}-1' again "
        "(their retention is not extended: tried again at the next batch): no offsets for ***",
    ]
    assert SECRET not in caplog.text
    # the markers read as before
    assert [c.partition for c in sink.committed_partitions(_batch(pipeline), PLAN)] == [0, 1]


def test_a_batch_renews_the_markers_again_once_the_last_renewal_is_the_interval_old(
    kafka: Broker, renewals: list[_Spied], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 0 writes batch 0, then no rows in batches 1 to 3 (a quiet source): one
    ``open()`` renews its groups at batch 2, the first batch once the renewal of batch 0
    (none marked then) is the interval old (half the brokers' ``offsets.retention.minutes``;
    here an hour, the sink's clock moved on), and not at batches 1 and 3. Before, only at an
    ``open()``'s first batch: a run going on for longer than the retention lost them."""
    monkeypatch.setattr(KafkaSink, "marker_renewal_s", 3600.0)
    later = [0.0]  # what the sink's clock is moved on by
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + later[0])
    monkeypatch.setattr(sink_module, "time", clock)
    monkeypatch.setattr(renewal, "time", clock)  # the renewal schedule's clock
    topic, pipeline = f"rn-{uuid.uuid4().hex[:8]}", f"rn{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    sink = _sink(kafka, topic, pipeline)
    try:
        assert sink.committed_partitions(_batch(pipeline), PLAN) == []  # renews: none marked
        _commit(sink, pipeline, 0, 0)
        later[0] = 3599.0
        assert sink.committed_partitions(_batch(pipeline, 1), PLAN) == []
        assert renewals == []
        groups = {
            f"fanout/{pipeline}/events/p0{suffix}": marker(kafka.bootstrap, pipeline, "events",
                                                           0, "__fanout_markers", suffix=suffix)
            for suffix in SUFFIXES
        }  # fmt: skip
        assert groups[f"fanout/{pipeline}/events/p0"] == 1  # batch 0's
        held = {group: offset for group, offset in groups.items() if offset >= 0}
        assert sorted(held) == [f"fanout/{pipeline}/events/p0{s}" for s in ("", ".target")]
        later[0] = 3601.0
        assert sink.committed_partitions(_batch(pipeline, 2), PLAN) == []
        assert [(r.transactional_id, r.committed, r.closed) for r in renewals] == [
            (f"fanout/{pipeline}/events-0", held, True)
        ]
        later[0] = 7000.0
        assert sink.committed_partitions(_batch(pipeline, 3), PLAN) == []
        assert len(renewals) == 1  # not again before the interval
    finally:
        sink.close()


def test_the_renewal_interval_is_half_the_retention_the_brokers_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interval: half of ``offsets.retention.minutes`` as ``open()`` read it; when the
    brokers do not report it (or report nonsense), an hour, as their retention may be
    shorter than the 7 days assumed, except on Tansu (keeps offsets for ever): half of
    Kafka's default; ``marker_renewal_s`` over all. Counted per scope from the last
    renewal there."""
    week = 7 * 24 * 60
    assert renewal.renewal_interval_s("60") == 1800.0
    for unknown in (None, "", "x", "0", "-5", "nan", "inf"):
        assert renewal.renewal_interval_s(unknown) == 3600.0
        assert renewal.renewal_interval_s(unknown, unreported_s=5.0) == 5.0

    sink = KafkaSink("events", bootstrap_servers="b:1", topic="t")
    sink._warn_marker_retention(SimpleNamespace(broker_config=lambda name: None))
    assert sink._renewal_interval_s() == 3600.0
    sink._end_turns = "/tmp/turns"  # Tansu, as open() knows it
    assert sink._renewal_interval_s() == week * 30.0
    monkeypatch.setattr(KafkaSink, "marker_renewal_s", 7.0)
    assert sink._renewal_interval_s() == 7.0
    monkeypatch.setattr(KafkaSink, "marker_renewal_s", None)
    sink._end_turns = None

    sink._warn_marker_retention(SimpleNamespace(broker_config=lambda name: "60"))
    clock = [1000.0]
    monkeypatch.setattr(renewal, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    asked: list[tuple[str, int]] = []

    def renew(settings: Any, span: int, batch_id: int, *, warn: bool) -> renewal.Renewal:
        asked.append((settings.scope, batch_id))
        return renewal.Renewal()

    monkeypatch.setattr(renewal, "renew_markers", renew)
    for at, scope, batch_id in [(0, "p", 0), (1799, "p", 1), (1800, "p", 2), (1801, "p", 3),
                                (1801, "p@e1", 4), (3599, "p", 5), (3600, "p", 6)]:  # fmt: skip
        clock[0] = 1000.0 + at
        sink._renew_markers(SimpleNamespace(scope=scope), 2, batch_id)  # type: ignore[arg-type]
    assert asked == [("p", 0), ("p", 2), ("p@e1", 4), ("p", 6)]


def test_a_renewal_that_failed_is_tried_a_minute_later_and_warned_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal that failed for a writer, or could not read the markers, is not counted:
    a batch at least ``renewal_retry_s`` (60 s) later tries it again (up to this version not
    for half a retention, in which the markers could expire; not at every batch either: a
    renewal fences and commits every marked writer). It warns at most once per scope and
    interval (half of 60 minutes here): ``warn`` is false for the tries in between. A
    complete renewal counts from when it began, as before."""
    sink = KafkaSink("events", bootstrap_servers="b:1", topic="t")
    sink._warn_marker_retention(SimpleNamespace(broker_config=lambda name: "60"))
    clock = [0.0]
    monkeypatch.setattr(renewal, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    failed, unread, done = (renewal.Renewal(failed=("t-0",)), renewal.Renewal(unread=True),
                            renewal.Renewal(renewed={"g": 1}))  # fmt: skip
    answers = {0: failed, 2: unread, 3: failed, 4: failed, 5: done, 7: failed, 9: done,
               10: failed}  # fmt: skip
    asked: list[tuple[str, int, bool]] = []

    def renew(settings: Any, span: int, batch_id: int, *, warn: bool) -> renewal.Renewal:
        asked.append((settings.scope, batch_id, warn))
        return answers.get(batch_id, done)

    monkeypatch.setattr(renewal, "renew_markers", renew)
    for at, scope, batch_id in [(0, "p", 0), (10, "p", 1), (60, "p", 2), (70, "p@e1", 3),
                                (1799, "p", 4), (1860, "p", 5), (3659, "p", 6),
                                (3660, "p", 7), (3670, "p", 8), (3720, "p", 9),
                                (5520, "p", 10), (5580, "p", 11)]:  # fmt: skip
        clock[0] = float(at)
        sink._renew_markers(SimpleNamespace(scope=scope), 2, batch_id)  # type: ignore[arg-type]
    assert asked == [
        ("p", 0, True),  # failed: warned
        # batch 1, 10 s after the failed try: not tried
        ("p", 2, False),  # 60 s after: tried again, markers unread: not warned again
        ("p@e1", 3, True),  # another scope warns on its own
        ("p", 4, False),  # 1799 s after the warning: still not
        ("p", 5, True),  # 1860 s: would warn again; complete (no warning), counted from 1860
        # batch 6 at 3659: not due
        ("p", 7, True),  # 3660: due; fails; warned (the last warning was at 0)
        # batch 8, 10 s after the failed try: not tried
        ("p", 9, False),  # 60 s after: tried, not warned; complete, counted from 3720
        ("p", 10, True),  # 5520: due; fails; warned (1860 s after the last warning)
        ("p", 11, False),  # tried again 60 s later: not warned
    ]


def test_a_renewal_that_raises_is_tried_again_later_and_warned_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal that raises (a transaction it left open that cannot be ended: the batch
    fails) counts as failed: not tried again for ``renewal_retry_s``, not warned again."""
    sink = KafkaSink("events", bootstrap_servers="b:1", topic="t")
    sink._warn_marker_retention(SimpleNamespace(broker_config=lambda name: "60"))
    clock = [0.0]
    monkeypatch.setattr(renewal, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    asked: list[tuple[int, bool]] = []

    def renew(settings: Any, span: int, batch_id: int, *, warn: bool) -> renewal.Renewal:
        asked.append((batch_id, warn))
        raise TransientSinkError("cannot end it", sink="events", batch_id=batch_id)

    monkeypatch.setattr(renewal, "renew_markers", renew)
    clock[0] = 0.0
    with pytest.raises(TransientSinkError):
        sink._renew_markers(SimpleNamespace(scope="p"), 2, 0)  # type: ignore[arg-type]
    clock[0] = 30.0
    sink._renew_markers(SimpleNamespace(scope="p"), 2, 1)  # type: ignore[arg-type]
    clock[0] = 60.0
    with pytest.raises(TransientSinkError):
        sink._renew_markers(SimpleNamespace(scope="p"), 2, 2)  # type: ignore[arg-type]
    assert asked == [(0, True), (2, False)]  # batch 1 not tried; batch 2 not warned


def test_a_renewal_the_brokers_refuse_is_tried_again_at_the_next_batch_on_the_broker(
    kafka: Broker, renewals: list[_Spied], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Partition 0 committed batch 0 under an earlier ``open()``. The next ``open()``'s
    renewal at batch 1 is refused by the brokers (its producer's ``init_transactions``,
    the text holding a password): warned once, redacted. Batch 2 tries again (refused:
    not warned again), batch 3 renews every group at the offset it holds, and batch 4 no
    more (the interval, half of 7 days on Tansu, has not passed). Before, batches 2 to 4
    renewed nothing: the first failure counted as the renewal."""
    topic, pipeline = f"rn-{uuid.uuid4().hex[:8]}", f"rn{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    earlier = _sink(kafka, topic, pipeline)
    try:
        assert earlier.committed_partitions(_batch(pipeline), PLAN) == []
        _commit(earlier, pipeline, 0, 0)
    finally:
        earlier.close()
    monkeypatch.setattr(KafkaSink, "renewal_retry_s", 0.0)  # each batch tries again
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=2, producer={"sasl.password": SECRET})  # fmt: skip
    sink.open(SinkContext(pipeline))
    spied = renewal.Producer  # the fixture's: each producer recorded in ``renewals``
    refusal: list[Exception | None] = [
        KafkaException(KafkaError(KafkaError._TRANSPORT, f"broker said no to {SECRET}"))
    ]

    def make(config: dict[str, Any]) -> _Spied:
        made = spied(config)
        made.refused = refusal[0]
        return made

    monkeypatch.setattr(renewal, "Producer", make)
    try:
        with caplog.at_level(logging.DEBUG, "fanout_kafka"):
            assert sink.committed_partitions(_batch(pipeline, 1), PLAN) == []
            assert sink.committed_partitions(_batch(pipeline, 2), PLAN) == []
        prefix = f"fanout/{pipeline}/events"
        assert [(r.transactional_id, r.committed, r.closed) for r in renewals] == [
            (f"{prefix}-0", None, True), (f"{prefix}-0", None, True)
        ]  # fmt: skip
        said = [(r.levelname, r.getMessage()) for r in caplog.records
                if "cannot commit the marker groups" in r.getMessage()]  # fmt: skip
        refused = str(KafkaException(KafkaError(KafkaError._TRANSPORT, "broker said no to ***")))
        assert said == [
            (level, f"sink 'events', batch {b}: cannot commit the marker groups of "
             f"'{prefix}-0' again (their retention is not extended: tried again at the next "
             f"batch): {refused}") for level, b in (("WARNING", 1), ("DEBUG", 2))
        ]  # fmt: skip
        assert SECRET not in caplog.text
        refusal[0] = None
        groups = {
            f"fanout/{pipeline}/events/p0{suffix}": marker(kafka.bootstrap, pipeline, "events",
                                                           0, "__fanout_markers", suffix=suffix)
            for suffix in SUFFIXES
        }  # fmt: skip
        held = {group: offset for group, offset in groups.items() if offset >= 0}
        assert held[f"fanout/{pipeline}/events/p0"] == 1  # batch 0's
        assert sink.committed_partitions(_batch(pipeline, 3), PLAN) == []
        assert sink.committed_partitions(_batch(pipeline, 4), PLAN) == []
        assert [(r.transactional_id, r.committed) for r in renewals] == [
            (f"{prefix}-0", None), (f"{prefix}-0", None), (f"{prefix}-0", held)
        ]  # fmt: skip
    finally:
        sink.close()


def test_a_renewal_that_waited_out_its_timeout_is_retried_a_minute_after_it_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A renewal whose marker read waited out a 60 s timeout counts its retry delay from
    its end: the batch right after it does not wait out another (a unit test without a
    broker made seven 60 s waits in a row)."""
    sink = KafkaSink("events", bootstrap_servers="b:1", topic="t")
    sink._warn_marker_retention(SimpleNamespace(broker_config=lambda name: "60"))
    clock = [0.0]
    monkeypatch.setattr(renewal, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    asked: list[int] = []

    def renew(settings: Any, span: int, batch_id: int, *, warn: bool) -> renewal.Renewal:
        asked.append(batch_id)
        clock[0] += 60.0  # the read's timeout
        return renewal.Renewal(unread=True)

    monkeypatch.setattr(renewal, "renew_markers", renew)
    for batch_id in range(3):  # each 1 s after the one before ended
        clock[0] += 1.0
        sink._renew_markers(SimpleNamespace(scope="p"), 2, batch_id)  # type: ignore[arg-type]
    clock[0] += 60.0
    sink._renew_markers(SimpleNamespace(scope="p"), 2, 3)  # type: ignore[arg-type]
    assert asked == [0, 3]
