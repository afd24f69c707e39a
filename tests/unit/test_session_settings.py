"""fanout.contract.sessions.session_settings: options set for a block and restored after,
with fanout's threads taking turns (no Spark here: a conf that records every change)."""

from __future__ import annotations

import threading
import time

from fanout.contract.sessions import ADAPTIVE, session_settings


class RecordingConf:
    """A session conf: get, set, unset, and what each thread saw inside its block."""

    def __init__(self, **settings: str) -> None:
        self.settings = dict(settings)
        self._lock = threading.Lock()

    def get(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            return self.settings.get(key, default)

    def set(self, key: str, value: str) -> None:
        with self._lock:
            self.settings[key] = value

    def unset(self, key: str) -> None:
        with self._lock:
            self.settings.pop(key, None)


def test_set_for_the_block_then_restored_or_unset() -> None:
    conf = RecordingConf(**{ADAPTIVE: "true"})
    with session_settings(conf, {ADAPTIVE: "false", "x.unset": "false"}):
        assert conf.settings == {ADAPTIVE: "false", "x.unset": "false"}
    assert conf.settings == {ADAPTIVE: "true"}


def test_restored_when_the_block_raises() -> None:
    conf = RecordingConf()
    try:
        with session_settings(conf, {ADAPTIVE: "false"}):
            raise RuntimeError("planning failed")
    except RuntimeError:
        pass
    assert conf.settings == {}


def test_threads_take_turns_so_none_restores_another_ones_setting() -> None:
    # without the turns, a thread entering while another is inside reads "false" as the
    # session's own value and restores it last: adaptive execution would stay off
    conf = RecordingConf(**{ADAPTIVE: "true"})
    seen: list[str | None] = []

    def plan() -> None:
        with session_settings(conf, {ADAPTIVE: "false"}):
            time.sleep(0.01)
            seen.append(conf.get(ADAPTIVE))

    threads = [threading.Thread(target=plan) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == ["false"] * 8
    assert conf.settings == {ADAPTIVE: "true"}
