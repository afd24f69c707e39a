"""``fanout recover --config``: ask each sink of the pipeline file whether it holds, by its
own records, the batch after its mark (ARCHITECTURE §5, "A batch written but never marked").

The sinks are built and opened as ``fanout validate`` opens them
(``SinkContext(checking=True)``: a sink type that does not declare
:attr:`fanout.Sink.read_only_check` is not opened, nor asked); no Spark session, nothing
written to them. Each sink is asked :meth:`fanout.Sink.holds_batch` about the batch the
new epoch's start would ask it about (:func:`fanout.steps.unmarked.refuse_unmarked`): the
batch after its last mark, or the epoch's first for a sink without a mark. The start keeps
its own check (the guarantee); this is advice, given before a reset instead of at its
refusal. Every secret the sinks declare is registered, so the output masks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fanout.contract.sink import Sink, SinkContext
from fanout.delta_tables.io import one_line
from fanout.ledger.entry import LOST_MARK, REWRITTEN, Ledger, LedgerEntry, ledger_location
from fanout.observe.logs import register_secrets
from fanout.steps.unmarked import (
    Held,
    ask_in_turn,
    before_start,
    lost_mark,
    recorded_offsets,
    unmarked_asks,
)

if TYPE_CHECKING:
    from fanout.hooks.registry import Registry

RECORDED_BY = "recorded by fanout recover"
"""What a lost mark ``fanout recover`` records says after :data:`LOST_MARK`."""


@dataclass(frozen=True)
class Asked:
    """The sinks' answers about the batch after their marks in ``epoch``.

    :param marks: each sink's last mark in ``epoch`` before this (``None``: no mark).
    :param answers: the sinks asked, each with its answer.
    :param not_asked: the sinks not asked, each with why.
    :param offsets: per sink holding its batch, that batch's source offsets as another
        sink's mark recorded them (``None``: no sink marked it).
    :param unrecorded: why the ledger could not record the lost marks found.
    """

    config: str
    epoch: int
    marks: dict[str, int | None]
    answers: list[Held] = field(default_factory=list)
    not_asked: dict[str, str] = field(default_factory=dict)
    offsets: dict[str, str | None] = field(default_factory=dict)
    unrecorded: str | None = None
    """Why the lost marks found could not be recorded (``None``: recorded, or not asked to)."""

    @property
    def held(self) -> list[Held]:
        """The sinks holding the batch after their mark."""
        return [a for a in self.answers if a.holds]

    def lost_marks(self, ledger: Ledger, pipeline: str) -> list[LedgerEntry]:
        """The marks the sinks holding their batch lost, as ``fanout recover`` records
        them (by the epoch's owner, with the batch's offsets when another sink marked it)."""
        owner = ledger.epoch_owners(pipeline).get(self.epoch) if self.held else None
        marks = []
        for h in (h for h in self.held if h.whole):  # never a mark of part of a batch
            recorded = f"{LOST_MARK if h.harmless is None else REWRITTEN}: {RECORDED_BY}"
            marks.append(lost_mark(pipeline, self.epoch, h, owner, self.offsets[h.sink], recorded))
        return marks


def ask_sinks(
    config: Any, file: str, ledger: Ledger, epoch: int, spooled: Mapping[str, int]
) -> Asked:
    """Ask each sink of the pipeline ``config`` (read from ``file``) about the batch after
    its mark in ``epoch``; ``spooled``: per lagging sink, the last batch of ``epoch`` the
    spool gives it (a sink whose spool holds the batch is not asked: the catch-up writes
    it under the old epoch's keys)."""
    names = [str(options["name"]) for options in config.sinks]
    marks = ledger.last_committed(config.name, names, epoch)
    before = before_start(ledger, config.name, epoch, marks)
    asks = unmarked_asks(before, marks)
    asked = Asked(file, epoch, dict(marks))
    for options in config.sinks:
        name = str(options["name"])
        mark = marks.get(name)
        after = before if mark is None else mark
        if spooled.get(name, -1) > after:
            continue
        sink = _opened(config.name, options, ledger, asked.not_asked, config.plugins)
        if sink is None:
            continue
        try:
            answer = ask_in_turn(sink, config.name, epoch, asks if mark is None else (mark,))
        finally:
            sink.close()
        asked.answers.append(answer)
        if answer.holds:
            asked.offsets[name] = recorded_offsets(ledger, config.name, epoch, answer.mark + 1)
    return asked


def built_sink(options: Mapping[str, Any], plugins: Sequence[str] = ()) -> tuple[Sink, Registry]:
    """The sink a pipeline file's ``options`` (one ``[[sinks]]`` table) describe, built
    (not opened) with its secrets registered, and the registry of the installed plugins and
    the file's own ``plugins`` it was built by. Raises what the options' checks raise."""
    from fanout.hooks.registry import load_registry
    from fanout.retry import RetryPolicy
    from fanout.sink_spec import split_core_options

    registry = load_registry(plugins)
    own, _, _, _ = split_core_options(str(options["name"]), options, RetryPolicy())
    sink = registry.build_sink(own, registry.sink_types())
    register_secrets(sink.secret_values())
    return sink, registry


def _opened(
    pipeline: str,
    options: Mapping[str, Any],
    ledger: Ledger,
    not_asked: dict[str, str],
    plugins: Sequence[str] = (),
) -> Sink | None:
    """The sink ``options`` describe, built and opened as ``fanout validate`` opens it
    (``None``, with why in ``not_asked``, when it cannot be); ``plugins``: the pipeline
    file's own modules (its ``plugins`` key)."""
    from fanout.deadletters.target import resolve_target

    name = str(options["name"])
    try:
        sink, registry = built_sink(options, plugins)
    except Exception as exc:
        not_asked[name] = f"its options: {_text(exc)}"
        return None
    if not type(sink).read_only_check:
        not_asked[name] = (
            f"{type(sink).__name__} does not declare read_only_check, so its open() might "
            "create or change things (the new epoch's start asks it)"
        )
        return None
    try:
        dead_letters = resolve_target(sink, registry.dead_letter_kinds())
        context = SinkContext(pipeline, None, dead_letters, checking=True,
                              ledger=ledger_location(ledger))  # fmt: skip
        sink.open(context)
    except Exception as exc:
        not_asked[name] = f"cannot open its target: {_text(exc)}"
        return None
    return sink


def _text(exc: BaseException) -> str:
    text = str(exc).strip()
    return one_line(text) if text else type(exc).__name__
