"""The column lists :mod:`fanout.partitioned.frame_steps` keeps in the JVM: made once per
list of columns and JVM, made again for a new JVM (a session started after another)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fanout.partitioned import frame_steps


def test_lists_are_made_once_per_columns_and_per_jvm(monkeypatch: Any) -> None:
    made: list[tuple[Any, ...]] = []

    def make(sc: Any, select: Any, by: Any, sort: Any) -> Any:
        made.append((sc._gateway, select, by, sort))
        return frame_steps._JvmLists(sc._gateway, select, by, sort)

    monkeypatch.setattr(frame_steps, "_make", make)
    monkeypatch.setattr(frame_steps, "_kept", {})
    first, second = SimpleNamespace(_gateway=object()), SimpleNamespace(_gateway=object())
    one = frame_steps._lists(first, ["`a`"], ["`a`"], [])
    assert frame_steps._lists(first, ("`a`",), ("`a`",), ()) is one
    other = frame_steps._lists(first, ["`a`", "`b`"], ["`a`"], [])
    assert frame_steps._lists(first, None, ["`a`"], []) is not other
    renewed = frame_steps._lists(second, ["`a`"], ["`a`"], [])
    assert renewed is not one and renewed.gateway is second._gateway
    assert made == [
        (first._gateway, ("`a`",), ("`a`",), ()),
        (first._gateway, ("`a`", "`b`"), ("`a`",), ()),
        (first._gateway, None, ("`a`",), ()),
        (second._gateway, ("`a`",), ("`a`",), ()),
    ]
