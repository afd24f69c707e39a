"""Where a sink's dead letters go: the ``dead_letter`` option's one grammar, the target
protocol, and the transaction ids that make every target write each batch's letters once.

Grammar (:func:`fanout.contract.dead_letters.split_target`, where the ledger's records of
each sink's target read it too), resolved here for every sink::

    dead_letter = "<kind>:<location>"     e.g. "postgres:ops.rejects", "kafka:orders-dlq"
    dead_letter = "<path or URI>"         a Delta table: "/data/dead", "s3://b/dead"
    dead_letter = "delta:<path or URI>"   the same, explicitly

The kinds are contributed by plugins through the hook ``fanout_dead_letter_kinds``; the
core contributes ``delta`` (:mod:`fanout.deadletters.delta`), which every sink can use. A
kind's factory receives the location and the configured sink, and refuses a sink it cannot
serve (a ``postgres`` target needs the sink's database) with a
:class:`fanout.ConfigurationError`; so does an unknown kind. :class:`fanout.FanOut`
resolves every sink's target when it is built, before the stream starts, and hands it to
the sink in :attr:`fanout.SinkContext.dead_letters`.

Transaction ids: a target writes a batch's letters under
``batch.idempotency_key.derived(letter_kind(source, partition))``
(:func:`fanout.contract.dead_letters.letter_kind`), i.e.
``fanout/<pipeline>/<sink>/dead_letters/<route|refused>[/p<n>]`` at the batch id, so a
replay writes them once, and a route's letters never collide with the sink's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fanout.contract.dead_letters import split_target
from fanout.errors import ConfigurationError

if TYPE_CHECKING:
    from fanout.contract.dead_letters import DeadLetterTarget
    from fanout.contract.sink import Sink


DeadLetterKind = Callable[[str, "Sink"], "DeadLetterTarget"]
"""A kind's factory: ``(location, sink) -> target``; raises
:class:`fanout.ConfigurationError` when it cannot serve that sink or location."""


def resolve_target(sink: Sink, kinds: Mapping[str, DeadLetterKind]) -> DeadLetterTarget | None:
    """The target of ``sink``'s ``dead_letter`` option (``None`` without one)."""
    text: Any = getattr(sink, "dead_letter", None)
    if text is None:
        return None
    known = ", ".join(sorted(kinds)) or "none installed"
    if not isinstance(text, str) or not text.strip():
        raise ConfigurationError(
            f"sink {sink.name!r}: option 'dead_letter' must be a string, '<kind>:<location>' "
            f"(kinds: {known}) or a Delta table path; got {text!r}"
        )
    kind, location = split_target(text.strip())
    if not location:
        raise ConfigurationError(f"sink {sink.name!r}: dead_letter {text!r} names nothing")
    factory = kinds.get(kind)
    if factory is None:
        raise ConfigurationError(
            f"sink {sink.name!r}: dead_letter {text!r} is a {kind} target, but no installed "
            f"plugin provides that kind (kinds: {known})"
        )
    return factory(location, sink)
