"""The first write's read of the topic's end (:mod:`fanout_kafka.renamed`) ends within the
sink's ``open_timeout_s`` as a whole: its rounds, its tries again after an error that may
pass, their pauses and the markers' reads share one deadline. Each try was given the whole
``open_timeout_s`` again (and the markers' read its own 60 s), so a broker that stopped
answering held a sink's first batch for three times the time it was given, plus pauses."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fanout_kafka import vanished
from kafkatools import Broker, read_topic

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.errors import RenamedSinkError, TransientSinkError
from fanout.testing.faults import MarkLost


def _sink(kafka: Broker, topic: str, name: str, timeout_s: float) -> dict[str, Any]:
    """A Kafka sink's options into ``topic``, reading its end within ``timeout_s``."""
    return {"type": "kafka", "name": name, "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 2, "open_timeout_s": timeout_s,
            "marker_topic": f"{topic}-markers", "create_topic": True}  # fmt: skip


def _old_wrote_batch_0_unmarked(
    spark: Any, kafka: Broker, topic: str, pipeline: str, ledger: str
) -> BatchInfo:
    """Sink 'old' commits batch 0 (ids 0-3) and the driver "dies" before the ledger mark."""
    batch0 = BatchInfo(pipeline, 0, "q", batch_timestamp_ms=int(time.time() * 1000))
    with pytest.raises(BatchFailedError):
        FanOut(pipeline, MarkLost(ledger, "old"), [_sink(kafka, topic, "old", 6)],
               retries=0).process(spark.range(0, 4), batch0)  # fmt: skip
    return batch0


def _new_refused(
    spark: Any, options: dict[str, Any], pipeline: str, ledger: str, batch0: BatchInfo
) -> BatchFailedError:
    """Batch 0 handed to the renamed sink ``options``: its refusal."""
    renamed = FanOut(pipeline, ledger, [options], retries=0)
    try:
        with pytest.raises(BatchFailedError) as caught:
            renamed.process(spark.range(0, 4), batch0)
    finally:
        renamed.close()
    return caught.value


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_tail_read_and_its_tries_again_end_within_open_timeout_s() -> None:
    """A real client against a port nothing listens on (a broker stopped between the
    restart's open and its first write): every try fails with ``_TRANSPORT`` once the time
    it is given passes; the read is refused as transient once ``open_timeout_s`` passes
    (before: 3 tries of 2 s each and 0.75 s of pauses, about 6.8 s)."""
    from fanout_kafka import KafkaSink
    from fanout_kafka.driver_admins import admin_config

    bootstrap = f"127.0.0.1:{_free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="orders", open_timeout_s=2)
    config = {**admin_config(sink.producer, bootstrap), "log_level": 0}
    started = time.monotonic()
    with pytest.raises(TransientSinkError) as caught:
        sink._tail_check().read_tail(config, "orders", "p", 0, 4, {"events"}, None, started + 2)
    took = time.monotonic() - started
    assert took < 4.0, took  # the 2 s given, and a margin for a loaded machine
    text = str(caught.value)
    assert text.startswith(
        "sink 'events', batch 4: cannot write batch 4, this sink's first write to topic "
        "'orders' in the epoch: the read of the topic's end"
    )
    assert "within its open_timeout_s=2 s with an error worth trying again" in text
    assert "_TRANSPORT" in text or "_TIMED_OUT" in text
    assert "restart it once the brokers answer" in text


def test_a_tail_read_with_no_time_left_cannot_tell_and_reads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deadline already passed (the rounds before it used the time up): no request is
    sent, and the answer is "cannot tell" with the option to raise, as for a read that did
    not end in time (the caller warns, :meth:`fanout_kafka.KafkaSink._refuse_vanished_writer`)."""
    from fanout_kafka import KafkaSink
    from fanout_kafka.driver_admins import admin_config

    bootstrap = f"127.0.0.1:{_free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="orders", open_timeout_s=2)
    config = {**admin_config(sink.producer, bootstrap), "log_level": 0}

    def no_client(*args: object) -> None:  # exact at any load, unlike a time taken
        raise AssertionError("the read asked for a client: it would send a request")

    monkeypatch.setattr(vanished.ADMINS, "client", no_client)
    writers, held, unread = sink._tail_check().read_tail(
        config, "orders", "p", 0, 4, set(), None, time.monotonic()
    )
    assert (writers, held) == (None, {})
    assert "not all read within its open_timeout_s=2 s: raise it to read them" in unread


def test_a_name_read_past_that_used_the_time_up_refuses_the_write_not_doubles_it(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sink 'old', killed in its first batch after its commit, renamed 'new'; over its
    batch, another writer's records, and on top a vanished name's record ('ghost', no
    marker in the epoch: read past). The ghost's markers answer slowly (here: the answer,
    then the rest of ``open_timeout_s`` gone): the read again past the ghost, which would
    find 'old', has no time left. It answered "cannot tell" and 'new' wrote batch 0 again
    (keys 0-3 twice, on the shared deadline; each read had its own ``open_timeout_s``
    before). Now refused as transient, nothing written; raising ``open_timeout_s`` as
    printed finds 'old' and refuses it."""
    from confluent_kafka import Producer
    from fanout_kafka import KafkaSink
    from fanout_kafka.records import batch_headers
    from fanout_kafka.renamed import TAIL_OFFSETS

    pipeline, ledger = f"kcut{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    batch0 = _old_wrote_batch_0_unmarked(spark, kafka, topic, pipeline, ledger)
    # another writer buries the batch past the first round's offsets (test_renamed_sink),
    # and on top the ghost's record, found by the first round alone
    plain = Producer({"bootstrap.servers": kafka.bootstrap, "batch.num.messages": 1})
    for n in range(3 * (TAIL_OFFSETS + 10)):
        plain.produce(topic, b"{}", str(100 + n).encode(), partition=n % 3)
    plain.produce(topic, b"{}", b"99", partition=0,
                  headers=list(batch_headers(pipeline, "ghost", 9)))  # fmt: skip
    plain.flush(30)
    expected = [0, 1, 2, 3, 99, *range(100, 100 + 3 * (TAIL_OFFSETS + 10))]

    real = KafkaSink._markers_hold
    asked: list[str] = []

    def slow(self: KafkaSink, *args: Any) -> Any:
        answer = real(self, *args)
        asked.append(args[4])
        if args[4] == "ghost":  # a slow answer: what was left of the read's time (up to
            time.sleep(min(args[5], 6) + 0.2)  # 6 s) gone
        return answer

    monkeypatch.setattr(KafkaSink, "_markers_hold", slow)

    def run(timeout_s: float) -> BatchFailedError:
        return _new_refused(spark, _sink(kafka, topic, "new", timeout_s), pipeline, ledger, batch0)

    refused = run(6)
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, len(expected)))
    assert keys == expected  # before: 0-3 twice
    assert asked == ["ghost"]
    error = refused.failures["new"]
    assert type(error) is TransientSinkError
    text = str(error)
    assert text.startswith(
        f"sink 'new', batch 0: cannot write batch 0, this sink's first write to topic "
        f"'{topic}' in the epoch: the read of the topic's end"
    )
    assert "did not end within its open_timeout_s=6 s after reading past sink(s) 'ghost'" in text
    assert "raise the sink's open_timeout_s" in text
    # the way on, as printed: open_timeout_s raised, the read past the ghost finds 'old'
    again = run(20).failures["new"]
    assert isinstance(again, RenamedSinkError)
    assert f"topic '{topic}' holds batch 0 of sink 'old'" in str(again)
    assert asked == ["ghost", "ghost", "old"]
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, len(expected)))
    assert keys == expected


def test_a_read_again_after_a_failed_try_that_runs_out_of_time_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A try that failed with an error that may pass (a broker that came back late) took
    most of the time; the try again (here a stand-in: the read not ended in the time
    left) answered "cannot tell", and the batch was written, where a read given the whole
    time (each try's own, before the shared deadline) may have found the old name's
    batch. Now refused as transient, naming the error."""
    from confluent_kafka import KafkaError, KafkaException
    from fanout_kafka import KafkaSink
    from fanout_kafka import renamed as renamed_module

    tries: list[float] = []

    def tail(*args: Any, **kwargs: Any) -> dict[str, int] | None:
        tries.append(args[6])  # the time it is given
        if len(tries) == 1:
            time.sleep(0.5)
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
        return None  # not read within what was left

    monkeypatch.setattr(renamed_module, "tail_writers", tail)
    monkeypatch.setattr(renamed_module, "RETRY_PAUSE_S", 0.01)
    bootstrap = f"127.0.0.1:{_free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="orders", open_timeout_s=1)
    config = {"bootstrap.servers": bootstrap, "log_level": 0}
    with pytest.raises(TransientSinkError) as caught:
        sink._tail_check().read_tail(
            config, "orders", "p", 0, 4, {"events"}, None, time.monotonic() + 1
        )
    assert len(tries) == 2 and tries[1] < 0.5
    text = str(caught.value)
    assert text.startswith(
        "sink 'events', batch 4: cannot write batch 4, this sink's first write to topic "
        "'orders' in the epoch: the read of the topic's end"
    )
    assert "did not end within its open_timeout_s=1 s after a try that failed" in text
    assert "_TRANSPORT" in text and "raise the sink's open_timeout_s" in text


def test_a_found_name_whose_markers_get_no_time_left_names_the_way_that_works(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The topic's end read slowly (here: the read, then the rest of ``open_timeout_s``
    gone: a deep busy topic) finds 'old'; its markers' read, given what is left (before the
    shared deadline: 60 s), times out, and the refusal said only "restart it once the
    brokers answer": a restart reads as slowly and is refused again. It now names raising
    open_timeout_s, and that, done as printed, finds 'old' and refuses it."""
    from fanout_kafka import renamed as renamed_module

    pipeline, ledger = f"kdeep{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    batch0 = _old_wrote_batch_0_unmarked(spark, kafka, topic, pipeline, ledger)
    real = renamed_module.tail_writers

    def slow(*args: Any, **kwargs: Any) -> dict[str, int] | None:
        found = real(*args, **kwargs)
        time.sleep(min(args[6], 6) + 0.2)  # the time it was given, up to 6 s, gone
        return found

    monkeypatch.setattr(renamed_module, "tail_writers", slow)

    def run(timeout_s: float) -> BatchFailedError:
        return _new_refused(spark, _sink(kafka, topic, "new", timeout_s), pipeline, ledger, batch0)

    error = run(6).failures["new"]
    assert type(error) is TransientSinkError
    assert "within its open_timeout_s=6 s with an error worth trying again" in str(error)
    assert "with the sink's open_timeout_s raised" in str(error)
    again = run(20).failures["new"]  # raised, as printed
    assert isinstance(again, RenamedSinkError)
    assert f"topic '{topic}' holds batch 0 of sink 'old'" in str(again)
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 4))
    assert keys == [0, 1, 2, 3]  # written once, by 'old'
