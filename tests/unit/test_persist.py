"""The persist step caches a batch read by several sinks uncompressed (without Spark:
a fake session records the option's value at each ``persist`` call)."""

from __future__ import annotations

from typing import Any

from fanout import FanOut
from fanout.contract.batch import BatchInfo
from fanout.contract.partitions import BatchPartitioning
from fanout.ledger.memory import MemoryLedger
from fanout.steps.persist import ADAPTIVE, CACHE_COMPRESSED, persist_if_shared
from fanout.steps.state import BatchState
from tests.unit.fakes import FakeFrame, ScriptedSink


class FakeConf:
    """``SparkSession.conf``: ``get(key, None)`` is None for an option nobody set."""

    def __init__(self, **settings: str) -> None:
        self.settings = dict(settings)

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.settings[key] = value

    def unset(self, key: str) -> None:
        self.settings.pop(key, None)


class SessionFrame(FakeFrame):
    """A FakeFrame with a ``sparkSession`` whose ``conf`` is seen by ``persist``."""

    def __init__(self, conf: FakeConf) -> None:
        super().__init__()
        self.sparkSession = type("Session", (), {"conf": conf})()
        self.compressed_at_persist: list[Any] = []
        self.adaptive_at_persist: list[Any] = []

    def persist(self) -> SessionFrame:
        self.compressed_at_persist.append(self.sparkSession.conf.get(CACHE_COMPRESSED))
        self.adaptive_at_persist.append(self.sparkSession.conf.get(ADAPTIVE))
        return super().persist()  # type: ignore[return-value]


def persist(frame: FakeFrame, partitioning: BatchPartitioning | None = None) -> bool:
    """The persist step alone for two pending DataFrame sinks (the full ``process`` with a
    real session is tests/integration/test_persist_cache.py); ``partitioning``: what step
    4 repartitioned the batch by."""
    fan = FanOut("orders", MemoryLedger(), [ScriptedSink("a"), ScriptedSink("b")], backoff_s=0)
    state = BatchState(frame, BatchInfo("orders", 0), pending=["a", "b"])
    state.partitioning = partitioning
    return persist_if_shared(state, fan.specs)


def test_shared_batch_is_cached_uncompressed_and_the_option_restored() -> None:
    conf = FakeConf()
    frame = SessionFrame(conf)
    assert persist(frame)
    assert frame.compressed_at_persist == ["false"]  # set for the persist call ...
    assert conf.settings == {}  # ... and unset right after: the session is as it was


def test_an_explicit_session_setting_is_kept() -> None:
    conf = FakeConf(**{CACHE_COMPRESSED: "true"})
    frame = SessionFrame(conf)
    assert persist(frame)
    assert frame.compressed_at_persist == ["true"]
    assert conf.settings == {CACHE_COMPRESSED: "true"}


def test_a_frame_without_a_session_is_persisted_plainly() -> None:
    frame = FakeFrame()
    assert persist(frame)
    assert frame.persist_calls == 1


def test_a_repartitioned_batch_is_cached_without_adaptive_planning_then_restored() -> None:
    conf = FakeConf()
    frame = SessionFrame(conf)
    assert persist(frame, BatchPartitioning(4, ("id",)))
    assert frame.adaptive_at_persist == ["false"]
    assert frame.compressed_at_persist == ["false"]
    assert conf.settings == {}


def test_an_explicit_adaptive_setting_is_restored_and_an_unpartitioned_batch_keeps_it() -> None:
    conf = FakeConf(**{ADAPTIVE: "true"})
    frame = SessionFrame(conf)
    assert persist(frame, BatchPartitioning(4, ("id",)))
    assert frame.adaptive_at_persist == ["false"]
    assert conf.settings == {ADAPTIVE: "true"}
    assert persist(frame)  # no shared partitioning: adaptive planning stays as it is
    assert frame.adaptive_at_persist == ["false", "true"]
    assert conf.settings == {ADAPTIVE: "true"}
