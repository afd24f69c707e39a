"""Which live ``FanOut`` owns each :class:`fanout.Sink` object (docs/architecture.md §8).

A sink's :meth:`fanout.Sink.open` acquires what its writes use (a PostgreSQL sink's driver
engine, a Kafka sink's hold on a shared admin client) and keeps it on the object. Opened by a
second ``FanOut`` while the first still runs (a notebook cell run again with the same sink
objects, two pipelines given one object), the second open replaced what the first was using,
and the first pipeline's close, or a failed second one's, closed it under the other. So one
Sink object serves one live ``FanOut``: from its ``FanOut(...)`` until that FanOut closes, or
is garbage-collected (weak references: a FanOut nobody holds any more holds no sink).

Keyed by ``id()``: sink types may be unhashable (a dataclass with ``eq``). While the owner
lives it holds the sink, so that id is the sink's; a weak reference to the sink tells a
reused id apart once it no longer does.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from fanout.contract.sink import Sink
from fanout.errors import ConfigurationError

Held = Literal["opening", "writing", "catching-up"]
"""What still uses a sink after its owner closed: a reopen's ``open()`` running past its
``write_timeout_s`` (its thread closes the sink once it returns), a write abandoned at
its ``write_timeout_s`` still running, or a catch-up write of a sink without
``write_timeout_s`` that ``close()`` did not wait out (the sink was left open under each)."""

_STILL = {
    "opening": (
        "the sink's open() ran on past its write_timeout_s: that open's thread closes the "
        "sink once it returns, which opened again here would close it under this FanOut. "
        "Wait for that open() to return (find what holds the sink's target)"
    ),
    "writing": (
        "a write of the sink, abandoned at its write_timeout_s, was still running: the sink "
        "was left open under it, and opened again here, what that write uses would be "
        "replaced under it. Wait for that write to end (find what holds the sink's target)"
    ),
    "catching-up": (
        "a catch-up write of the sink (it has no write_timeout_s) was still running past "
        "close()'s 30 s wait: the sink was left open under it, and opened again here, what "
        "that write uses would be replaced under it. Wait for that write to end (find what "
        "holds the sink's target, or set write_timeout_s)"
    ),
}


@dataclass(frozen=True)
class _Claim:
    sink: weakref.ref[Sink]
    owner: weakref.ref[object]
    pipeline: str
    stopped: Held | None = None
    """The owner closed (or failed to start) while this still used the sink."""


_claims: dict[int, _Claim] = {}
_lock = threading.Lock()


def claim(owner: object, pipeline: str, sinks: Sequence[Sink]) -> None:
    """Make ``owner`` (a ``FanOut`` of ``pipeline``) the owner of each of ``sinks``, before
    it opens any. Raises :class:`fanout.ConfigurationError` (and claims none) when one is
    owned by another live ``FanOut`` that has not been closed, naming the sink, that
    FanOut's pipeline and what to do."""
    with _lock:
        taken = _taken(owner, sinks)
    if taken is not None:  # a FanOut nobody holds is garbage, if in reference cycles (a
        gc.collect()  # bound method of it in its catch-up): collected, it holds nothing
    with _lock:
        taken = _taken(owner, sinks)
        if taken is not None and taken[1].stopped is not None:
            sink, held = taken
            still = _STILL[taken[1].stopped]
            raise ConfigurationError(
                f"pipeline {pipeline!r}: sink {sink.name!r} ({type(sink).__name__} object) "
                f"is still held by a FanOut (pipeline {held.pipeline!r}) that was closed, or "
                f"failed to start, while {still}, or give this FanOut a sink "
                "of its own (a dict configuration, or a new Sink object)"
            )
        if taken is not None:
            sink, held = taken
            raise ConfigurationError(
                f"pipeline {pipeline!r}: sink {sink.name!r} ({type(sink).__name__} object) "
                f"is open in another FanOut (pipeline {held.pipeline!r}) that has not been "
                "closed: one Sink object serves one FanOut at a time (opened again here, what "
                "the other one writes with would be replaced under it). Close the other FanOut "
                "first (fo.close(), or build it in a `with FanOut(...) as fo:` block), or give "
                "this FanOut a sink of its own (a dict configuration, or a new Sink object)"
            )
        for sink in sinks:
            _claims[id(sink)] = _Claim(weakref.ref(sink), weakref.ref(owner), pipeline)


def _taken(owner: object, sinks: Sequence[Sink]) -> tuple[Sink, _Claim] | None:
    """The first of ``sinks`` another live owner holds, and its claim (under the lock)."""
    _forget_dead()
    for sink in sinks:
        held = _claims.get(id(sink))
        if held is not None and held.sink() is sink and held.owner() not in (None, owner):
            return sink, held
    return None


def release(
    owner: object,
    sinks: Sequence[Sink] | None = None,
    *,
    keep: Sequence[tuple[Sink, Held]] = (),
) -> None:
    """``owner`` closed (or failed to start): its sinks (``sinks`` only, when given), but
    those in ``keep``, may serve another ``FanOut``. A sink kept is still used, by what its
    :data:`Held` says: its ``open()`` running in a reopen's thread (kept until that thread
    has closed it), or a write abandoned at its ``write_timeout_s`` (kept until it ends);
    whatever waits for that releases it then."""
    chosen = None if sinks is None else {id(s) for s in sinks}
    kept = {id(s): held for s, held in keep}
    with _lock:
        _forget_dead()
        for key in [k for k, held in _claims.items() if held.owner() is owner]:
            if chosen is not None and key not in chosen:
                continue
            if key in kept:
                _claims[key] = replace(_claims[key], stopped=kept[key])
            else:
                del _claims[key]


def _forget_dead() -> None:
    """Drop the claims of owners or sinks garbage-collected (called under the lock)."""
    for key in [k for k, held in _claims.items() if held.owner() is None or held.sink() is None]:
        del _claims[key]
