"""Former transactional ids the brokers refuse to the sink's principal
(:func:`fanout_kafka.abandoned.fence_legacy_transactions`): a principal granted only the
prefix in use, as ``fanout validate``'s refusal tells, is refused the former default's ids
(``fanout-<pipeline>-<sink>-<p>``), which a sink on the default fences at the first batch
of each run. Before, every run's first batch failed on it.

Now the refusal is warned only once a run of the sink has fenced those ids: its prefix
record (:mod:`fanout_kafka.former_ids`) names the prefix in use, and a run records it only
after that fence passed. Before any such run, the batch fails and nothing is recorded, so
the next run tries the fence again: a task still alive under the former ids, of another
principal, could commit a batch the new ids commit too. Some ids refused, or another
error, fail the batch as before; so does a refused prefix the user changed.

Tansu has no ACLs: the brokers' refusal of ``init_transactions`` is stood in, per id, by a
producer wrapper; everything else (the record, the markers, the commits) is the broker's."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from fanout_kafka import KafkaSink, abandoned
from fanout_kafka.former_ids import recorded_prefix
from kafkatools import Broker, create_topic, marker
from test_abandoned_transactions import PLAN, _batch, _commit

from fanout.contract.sink import SinkContext
from fanout.errors import TransientSinkError

REFUSED = KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


class _Brokers:
    """The ids whose ``init_transactions`` the brokers refuse (with ``code``), and every
    id the driver initialised through :mod:`fanout_kafka.abandoned`."""

    def __init__(self) -> None:
        self.refused: set[str] = set()
        self.code = REFUSED
        self.asked: list[str] = []


@pytest.fixture
def brokers(monkeypatch: pytest.MonkeyPatch) -> _Brokers:
    said = _Brokers()
    real = abandoned.Producer

    class Refusing:
        def __init__(self, config: dict[str, Any]) -> None:
            self._id = str(config["transactional.id"])
            self._inner = real(config)
            said.asked.append(self._id)

        def init_transactions(self, timeout: float) -> None:
            if self._id in said.refused:
                raise KafkaException(KafkaError(said.code, "stood-in refusal"))
            self._inner.init_transactions(timeout)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    monkeypatch.setattr(abandoned, "Producer", Refusing)
    return said


def _sink(kafka: Broker, topic: str, pipeline: str, prefix: str | None = None) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=2, transactional_id_prefix=prefix)  # fmt: skip
    sink.open(SinkContext(pipeline))
    return sink


def _former(prefix: str) -> list[str]:
    """The ids of ``prefix`` fenced for a sink of two partitions."""
    return [f"{prefix}-0", f"{prefix}-1", f"{prefix}#route-0"]


def _recorded(sink: KafkaSink, pipeline: str) -> str | None:
    return recorded_prefix(sink.settings(_batch(pipeline)), 10)


def _fails(sink: KafkaSink, pipeline: str, batch_id: int = 0) -> str:
    with pytest.raises(TransientSinkError) as caught:
        sink.committed_partitions(_batch(pipeline, batch_id), PLAN)
    return str(caught.value)


def test_former_default_ids_refused_fail_the_first_batch_until_a_run_fenced_them(
    kafka: Broker, brokers: _Brokers, caplog: pytest.LogCaptureFixture
) -> None:
    topic, pipeline = f"fr-{uuid.uuid4().hex[:8]}", f"fr{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    legacy = f"fanout-{pipeline}-events"
    brokers.refused.update(_former(legacy))

    first = _sink(kafka, topic, pipeline)  # no run has fenced them: refused
    said = _fails(first, pipeline)
    assert said.startswith(
        f"sink 'events', batch 0: cannot end the transactions left open under the former "
        f"transactional ids {legacy}-<p> (the brokers refuse them to the sink's principal: "
        f"grant it WRITE on the transactional ids prefixed '{legacy}' for one run, which "
        "fences them; the grant may be removed after it): "
    ), said
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in said
    assert _fails(first, pipeline) == said  # the batch's next attempt tries them again
    assert _recorded(first, pipeline) is None  # not recorded: the next run fences them
    assert _fails(_sink(kafka, topic, pipeline), pipeline) == said  # and so does a new run

    brokers.refused.clear()  # granted for one run: fenced, and the prefix recorded
    granted = _sink(kafka, topic, pipeline)
    assert granted.committed_partitions(_batch(pipeline), PLAN) == []
    assert _recorded(granted, pipeline) == f"fanout/{pipeline}/events"
    _commit(granted, pipeline, 0, 0)

    brokers.refused.update(_former(legacy))  # the grant removed
    brokers.asked.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, "fanout_kafka"):
        later = _sink(kafka, topic, pipeline)
        assert [c.partition for c in later.committed_partitions(_batch(pipeline, 1), PLAN)] == []
    assert set(_former(legacy)) <= set(brokers.asked)  # tried, refused, warned
    assert [r.getMessage() for r in caplog.records if legacy in r.getMessage()] == [
        f"sink 'events': the brokers refuse its principal the former transactional ids "
        f"{legacy}-<p> (TRANSACTIONAL_ID_AUTHORIZATION_FAILED for all 3), which an earlier "
        "run of this sink fenced (its recorded prefix is the one in use): not fenced again"
    ]
    _commit(later, pipeline, 0, 1)
    assert marker(kafka.bootstrap, pipeline, "events", 0, "__fanout_markers") == 2


@pytest.mark.parametrize(
    ("refused", "code"),
    [(["-1"], REFUSED), (["-0", "-1", "#route-0"], KafkaError._TRANSPORT)],
    ids=["one-of-them-refused", "not-a-refusal"],
)
def test_former_default_ids_not_all_refused_fail_the_batch_after_a_fence_too(
    kafka: Broker, brokers: _Brokers, refused: list[str], code: int
) -> None:
    """After a run fenced them, only a refusal of every former id is warned: some refused
    (an ACL that names ids one by one) or any other error fails the batch as before."""
    topic, pipeline = f"fr-{uuid.uuid4().hex[:8]}", f"fr{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    legacy = f"fanout-{pipeline}-events"
    fenced = _sink(kafka, topic, pipeline)
    assert fenced.committed_partitions(_batch(pipeline), PLAN) == []
    assert _recorded(fenced, pipeline) == f"fanout/{pipeline}/events"

    brokers.refused.update(legacy + suffix for suffix in refused)
    brokers.code = code
    said = _fails(_sink(kafka, topic, pipeline), pipeline, 1)
    assert said.startswith(
        f"sink 'events', batch 1: cannot end the transactions left open under the former "
        f"transactional ids {legacy}-<p>"
    ), said
    assert ("grant it WRITE" in said) is (code == REFUSED)


def test_a_changed_prefix_whose_former_ids_are_refused_fails_until_they_are_fenced(
    kafka: Broker, brokers: _Brokers
) -> None:
    """The ids of a prefix the user changed were never fenced by a run: refused, every run
    fails and the former prefix stays recorded, until a run may fence them."""
    topic, pipeline = f"fr-{uuid.uuid4().hex[:8]}", f"fr{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    old, new = f"{pipeline}-old", f"{pipeline}-new"
    before = _sink(kafka, topic, pipeline, old)
    assert before.committed_partitions(_batch(pipeline), PLAN) == []
    _commit(before, pipeline, 0, 0)

    brokers.refused.update(_former(old))
    changed = _sink(kafka, topic, pipeline, new)
    said = _fails(changed, pipeline, 1)
    assert said.startswith(
        f"sink 'events', batch 1: cannot end the transactions left open under the former "
        f"transactional ids {old}-<p> (the brokers refuse them to the sink's principal: "
        f"grant it WRITE on the transactional ids prefixed '{old}' for one run"
    ), said
    assert _recorded(changed, pipeline) == old
    assert _fails(_sink(kafka, topic, pipeline, new), pipeline, 1) == said

    brokers.refused.clear()
    granted = _sink(kafka, topic, pipeline, new)
    assert [c.partition for c in granted.committed_partitions(_batch(pipeline, 1), PLAN)] == []
    assert _recorded(granted, pipeline) == new
