"""When a fenced Kafka partition can have a rival whose commit it should wait for
(:mod:`fanout_kafka.rivals`): logic only, no Spark, no broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")
from fanout_kafka.rivals import rival_reason, speculation_of


@pytest.mark.parametrize(
    ("speculation", "attempt", "reason"),
    [
        (False, None, None),  # the driver
        (False, 0, None),  # a task's first attempt
        (True, 0, "spark.speculation is on"),
        (None, 0, "spark.speculation unknown"),
        (False, 1, "task attempt 1: an earlier attempt may still run"),
        (False, -1, "the task's attempt number unknown"),
    ],
)
def test_a_rival_is_assumed_unless_none_can_run(
    speculation: bool | None, attempt: int | None, reason: str | None
) -> None:
    assert rival_reason(speculation, attempt) == reason


def frame(conf: dict[str, str] | Exception) -> Any:
    def get(key: str, default: str) -> str:
        if isinstance(conf, Exception):
            raise conf
        return conf.get(key, default)

    return SimpleNamespace(sparkSession=SimpleNamespace(conf=SimpleNamespace(get=get)))


def test_speculation_is_read_from_the_session() -> None:
    assert speculation_of(frame({"spark.speculation": "True "})) is True
    assert speculation_of(frame({"spark.speculation": "false"})) is False
    assert speculation_of(frame({})) is False
    assert speculation_of(frame(RuntimeError("gone"))) is None
    assert speculation_of(None) is None
