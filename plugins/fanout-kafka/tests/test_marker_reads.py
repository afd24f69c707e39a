"""The driver's marker reads ask for stable offsets and wait out a transaction whose offset
commit the broker is still completing (unit tests of the logic: a fake admin client that
answers as Kafka does; Tansu ignores ``require_stable`` and cannot show the difference)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from fanout_kafka import membership
from fanout_kafka.errors import KafkaMarkerError

from fanout.partitioned.membership import PartitionPlan

PLAN = PartitionPlan(2, (("order_id", "bigint"),))


def group(p: int) -> str:
    return f"fanout/pipe/events/p{p}"


class FakeAdmin:
    """Answers each group with the next of its scripted answers: an offset, an error code
    for the partition (as Kafka's OffsetFetch answers an unstable offset), or an exception
    (the request failed as a whole)."""

    def __init__(self, answers: dict[str, list[int | KafkaError | KafkaException]]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, bool]] = []

    def list_consumer_group_offsets(self, request: list[Any], **options: Any) -> dict[str, Any]:
        (wanted,) = request
        name = wanted.group_id
        stable = bool(options.get("require_stable", False))
        self.requests.append((name, stable))
        script = self.answers.get(name, [-1001])
        answer = script.pop(0) if len(script) > 1 else script[0]
        if not stable and isinstance(answer, KafkaError):
            answer = 1  # an unstable read gets the offset before the pending commit
        future: Future[Any] = Future()
        if isinstance(answer, KafkaException):
            future.set_exception(answer)
            return {name: future}
        if isinstance(answer, KafkaError):
            tp = SimpleNamespace(offset=-1001, error=answer)
        else:
            tp = SimpleNamespace(offset=answer, error=None)
        future.set_result(SimpleNamespace(topic_partitions=[tp]))
        return {name: future}


def unstable() -> KafkaError:
    return KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT)


@pytest.fixture
def admin_of(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install a fake admin for the driver's reads."""

    def install(answers: dict[str, list[int | KafkaError | KafkaException]]) -> FakeAdmin:
        admin = FakeAdmin(answers)
        monkeypatch.setattr(membership, "_admin", lambda config: admin)
        return admin

    return install


def read(batch_id: int, timeout_s: float = 5.0) -> list[int]:
    """The partitions the driver finds holding ``batch_id``."""
    done = membership.committed_partitions(
        {}, "__fanout_markers", group, batch_id, PLAN, timeout_s, sink="events"
    )
    return [c.partition for c in done]


def test_a_marker_whose_commit_is_being_completed_is_read_once_stable(admin_of: Any) -> None:
    """p1 committed batch 1 (marker 2) in a transaction Kafka is still completing: the
    driver waits for it and finds p1 holding the batch, as p1's task will."""
    admin = admin_of({group(0): [1], group(1): [unstable(), unstable(), 2]})
    assert read(batch_id=1) == [1]
    assert all(stable for _, stable in admin.requests)
    assert [g for g, _ in admin.requests].count(group(1)) == 3


def test_a_request_refused_as_unstable_is_asked_again(admin_of: Any) -> None:
    admin = admin_of({group(0): [KafkaException(unstable()), 2], group(1): [1]})
    assert read(batch_id=1) == [0]
    assert [g for g, _ in admin.requests].count(group(0)) == 2


def test_a_marker_past_the_batch_behind_an_unstable_answer_is_still_refused(
    admin_of: Any,
) -> None:
    admin_of({group(0): [unstable(), 3], group(1): [1]})
    with pytest.raises(KafkaMarkerError, match="are past this batch"):
        read(batch_id=0)


def test_an_offset_that_stays_unstable_fails_the_read_after_the_timeout(admin_of: Any) -> None:
    admin_of({group(0): [unstable()], group(1): [1]})
    with pytest.raises(KafkaException) as raised:
        read(batch_id=1, timeout_s=0.2)
    assert raised.value.args[0].code() == KafkaError.UNSTABLE_OFFSET_COMMIT


class TopicsAdmin:
    """A cluster of ``topics`` (name: partition count) whose marker groups committed
    ``markers`` (group: {topic: offset}, on partition 0), answering as Kafka does: an
    offset per asked partition, -1 where the group committed none."""

    def __init__(self, topics: dict[str, int], markers: dict[str, dict[str, int]]) -> None:
        self.topics = topics
        self.markers = markers

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={
            name: SimpleNamespace(partitions=dict.fromkeys(range(count)))
            for name, count in self.topics.items()
        })  # fmt: skip

    def list_consumer_group_offsets(self, request: list[Any], **options: Any) -> dict[str, Any]:
        (wanted,) = request
        name = wanted.group_id
        found = self.markers.get(name, {})
        answer = [
            SimpleNamespace(topic=tp.topic, offset=found.get(tp.topic, -1), error=None)
            for tp in wanted.topic_partitions
        ]
        future: Future[Any] = Future()
        future.set_result(SimpleNamespace(topic_partitions=answer))
        return {name: future}


def moved_settings() -> Any:
    """A sink ``events`` of pipeline ``pipe`` whose markers are now in ``new-markers``."""
    return SimpleNamespace(marker_topic="new-markers", scope="pipe", sink="events",
                           marker_group=group, operation_timeout_s=5.0)  # fmt: skip


@pytest.mark.parametrize("old_partitions", [1, 3])
def test_a_half_batch_in_a_former_marker_topic_is_refused_even_when_it_gained_partitions(
    monkeypatch: pytest.MonkeyPatch, old_partitions: int
) -> None:
    """Batch 4 committed p1 with its markers in ``__fanout_markers``; ``marker_topic`` was
    changed to ``new-markers`` (no marker of batch 4 there) and the old topic given more
    partitions (``kafka-topics --alter --partitions 3``: its partition 0 keeps the
    markers). Up to this version only one-partition topics were read: the replay passed
    and wrote p1 again."""
    admin = TopicsAdmin(
        {"__fanout_markers": old_partitions, "new-markers": 1, "orders": 3},
        {group(0): {"__fanout_markers": 4}, group(1): {"__fanout_markers": 5}},
    )
    monkeypatch.setattr(membership, "_admin", lambda config: admin)
    monkeypatch.setattr(membership, "_elsewhere_checked", set())
    with pytest.raises(KafkaMarkerError) as refused:
        membership.refuse_markers_elsewhere({}, moved_settings(), 4, PLAN.partitions)
    assert str(refused.value) == (
        "sink 'events', batch 4: batch 4 is half written: its markers say partition(s) [1] "
        "in topic '__fanout_markers' hold it, but this sink's marker_topic is now "
        "'new-markers', where no partition holds it. A replay reads only the markers in the "
        "topic configured now, so it would write those partitions again. Nothing was "
        "written. Set marker_topic back to '__fanout_markers' until this batch is complete "
        "(a change between batches is safe); if those markers are another pipeline's with "
        "the same pipeline and sink names, rename one of them."
    )


def test_a_former_marker_topic_of_finished_batches_lets_the_batch_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old topic's markers are of batch 3 and earlier (a change between batches)."""
    admin = TopicsAdmin(
        {"__fanout_markers": 3, "new-markers": 1},
        {group(0): {"__fanout_markers": 4}, group(1): {"__fanout_markers": 3}},
    )
    monkeypatch.setattr(membership, "_admin", lambda config: admin)
    monkeypatch.setattr(membership, "_elsewhere_checked", set())
    membership.refuse_markers_elsewhere({}, moved_settings(), 4, PLAN.partitions)
    assert membership._elsewhere_checked == {("None", "new-markers", "pipe", "events")}


def test_a_sink_reopened_in_the_process_checks_other_topics_again(
    monkeypatch: pytest.MonkeyPatch, kafka: Any
) -> None:
    """In one process (a notebook): batch 4's check passed on ``new-markers``; the sink
    was then rebuilt on ``__fanout_markers``, wrote p1 of batch 5 there and failed, and
    was rebuilt on ``new-markers`` again. Up to this version the check cached for
    ``new-markers`` in the first run let batch 5 through and p1 was written again; the
    sink's ``open()`` (on the test broker) now clears it."""
    from fanout_kafka import KafkaSink

    from fanout.testing import open_sink

    admin = TopicsAdmin({"__fanout_markers": 1, "new-markers": 1},
                        {group(0): {"__fanout_markers": 4}})  # fmt: skip
    monkeypatch.setattr(membership, "_admin", lambda config: admin)
    monkeypatch.setattr(membership, "_elsewhere_checked", set())
    membership.refuse_markers_elsewhere({}, moved_settings(), 4, PLAN.partitions)
    admin.markers[group(1)] = {"__fanout_markers": 6}  # batch 5 half written there
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic="new-markers-target",
                     create_topic=True, marker_topic="new-markers")  # fmt: skip
    open_sink(sink, "pipe")
    sink.close()
    with pytest.raises(KafkaMarkerError, match=r"partition\(s\) \[1\] in topic '__fanout_m"):
        membership.refuse_markers_elsewhere({}, moved_settings(), 5, PLAN.partitions)
