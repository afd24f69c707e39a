"""A sink's ``dead_letter`` moved between an attempt of a batch and its replay
(docs/architecture.md §7, "A ``dead_letter`` moved between an attempt and its replay").

Every target keeps a batch's letters under the batch's transaction ids, so a replay under
the *same* target writes none it holds. A replay under *another* target (the driver killed
between an attempt and its ledger mark, the restart naming another ``dead_letter``) would
write them there too: each letter kept twice, once in each. So:

- the ledger records which target each sink had from which batch on, only when it changes
  (:mod:`fanout.ledger.target_records`, written and read by :class:`TargetMoves` at
  :class:`fanout.FanOut`'s start: two log-only lookups per sink, a write and a read only
  on a change);
- for the one batch of a sink an earlier process may have attempted under another target
  (its first batch of an epoch in this ``FanOut``), each such target is asked what it holds
  of the batch's letters (:func:`earlier_letters`, the target's ``letters_held``), before
  anything is written; a target that cannot tell refuses the batch
  (:class:`fanout.DeadLetterMovedError`);
- the answer rides with the batch (:attr:`fanout.Batch.earlier`) and every writer of letters
  goes through :func:`write_letters`, which writes none an earlier target holds: the
  target fanout hands a sink (:attr:`fanout.SinkContext.dead_letters`) is a
  :class:`CheckedTarget`, whose ``write`` is :func:`write_letters`, so a sink calling the
  target's ``write`` is filtered alike.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from fanout.contract.dead_letters import DELTA, DeadLetterTarget, ReplacesLetters, split_target
from fanout.contract.earlier_letters import EarlierLetters, HeldLetters
from fanout.contract.locations import local_path, shown_location
from fanout.deadletters.route_letters import check_unchanged, write_route_letters
from fanout.deadletters.target import DeadLetterKind
from fanout.errors import DeadLetterMovedError
from fanout.ledger.gaps import skip_command
from fanout.ledger.target_records import (
    BatchKey,
    TargetRecord,
    since_of,
    target_digest,
)
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import MASK, location_secrets, redact

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, RouteStamp, Source
    from fanout.contract.sink import Sink
    from fanout.ledger.entry import Ledger, LedgerView

log = logging.getLogger("fanout")


def recorded_text(sink: Sink) -> str | None:
    """The sink's ``dead_letter`` as the ledger records it: ``<kind>:<location>``, a Delta
    location absolute (a restart from another directory names the same table), masked of
    its password, its secret query values (``?sig=``) and the sink's secrets (``None``: no
    target)."""
    text: Any = getattr(sink, "dead_letter", None)
    if not isinstance(text, str) or not text.strip():
        return None
    kind, location = split_target(text.strip())
    if kind == DELTA and local_path(location) == location:  # a plain path, not a URI
        location = os.path.abspath(location)
    secrets = [*location_secrets(location), *sink.secret_values()]
    return redact(f"{kind}:{shown_location(location)}", secrets)


@runtime_checkable
class TargetLedger(Protocol):
    """What a ledger offers to record each sink's dead-letter targets
    (:class:`fanout.ledger.delta.DeltaLedger`, :class:`fanout.ledger.memory.MemoryLedger`);
    a ledger without it records none, and a moved target is not noticed."""

    def dead_letter_marks(self, pipeline: str, sinks: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Per sink with a record: ``(digest, since code)`` of its last one (log only)."""
        ...

    def dead_letter_records(self, pipeline: str, sink: str) -> list[TargetRecord]:
        """Every record of ``sink``, in order (a read of its rows: rare)."""
        ...

    def record_dead_letters(self, pipeline: str, records: Mapping[str, TargetRecord]) -> None:
        """Append one record per sink, each with its two transactions, in one commit."""
        ...


def next_batch(ledger: Ledger, pipeline: str, sink: str, view: LedgerView) -> BatchKey | None:
    """The batch after ``sink``'s last mark: of the pipeline's current epoch (``view``, the
    ledger's lookup of it), else of the latest epoch before it that has one (a lagging sink
    catches up older epochs; log-only lookups); ``None`` when it has none."""
    for epoch in range(view.epoch, -1, -1):
        if epoch == view.epoch:
            mark = view.marks.get(sink)
        else:
            mark = ledger.last_committed(pipeline, [sink], epoch).get(sink)
        if mark is not None:
            return epoch, mark + 1
    return None


class TargetMoves:
    """Each sink's earlier dead-letter targets that may hold letters of a batch it has not
    marked, as the ledger recorded them; built (and a changed target recorded) by
    :meth:`open` when a :class:`fanout.FanOut` starts.

    :param current: each sink's target now (:func:`recorded_text`).
    :param records: per sink whose records matter (its target changed now, or at the batch
        it is at), all its records, the current one last.
    """

    def __init__(
        self,
        current: Mapping[str, str | None],
        records: Mapping[str, Sequence[TargetRecord]] | None = None,
    ) -> None:
        self.current = dict(current)
        self.records = {sink: tuple(found) for sink, found in (records or {}).items()}

    @classmethod
    def open(cls, ledger: Ledger, pipeline: str, sinks: Mapping[str, Sink]) -> TargetMoves:
        """Compare each sink's target with its last record, record those that changed
        (one ledger commit) and read the records of the sinks that need them: see the
        module docstring. A ledger that cannot record them (no :class:`TargetLedger`)
        gives an empty history."""
        current = {name: recorded_text(sink) for name, sink in sinks.items()}
        if not isinstance(ledger, TargetLedger):
            return cls(current)
        marks = ledger.dead_letter_marks(pipeline, list(sinks))
        if not marks and not any(current.values()):
            return cls(current)  # no sink has or had a target: nothing to read
        view = ledger.lookup(pipeline, list(sinks))
        records: dict[str, list[TargetRecord]] = {}
        changed: dict[str, TargetRecord] = {}
        for name, text in current.items():
            last = marks.get(name)
            if last is None and text is None:
                continue  # never had a target: nothing to record
            since = next_batch(ledger, pipeline, name, view)
            if last is not None and last[0] == target_digest(text):
                recorded = since_of(last[1])
                if since is not None and (recorded is None or recorded < since):
                    continue  # batches were marked under it since it was recorded
                records[name] = ledger.dead_letter_records(pipeline, name)
                continue
            found = ledger.dead_letter_records(pipeline, name) if last is not None else []
            record = TargetRecord(max((r.number for r in found), default=0) + 1, text, since)
            changed[name] = record
            records[name] = [*found, record]
            log.info(
                "pipeline %s, sink %s: dead-letter target recorded from %s on: %s",
                pipeline, name, _batch_text(since), text or "none",
                extra=batch_fields(pipeline, sink=name),
            )  # fmt: skip
        if changed:
            ledger.record_dead_letters(pipeline, changed)
        return cls(current, records)

    def earlier(self, sink: str, key: BatchKey) -> list[str]:
        """The earlier targets of ``sink`` (other than its target now) that may hold
        letters of batch ``key``: each recorded from a batch at or before it, up to the
        next record's batch (the batch the sink was at when it changed, which the earlier
        target's process may have attempted), in order; empty on the common path."""
        found = self.records.get(sink)
        if not found:
            return []
        now = target_digest(self.current.get(sink))
        texts: dict[int, str] = {}
        for at, (record, after) in enumerate(pairwise(found)):
            if record.target is None or target_digest(record.target) == now:
                continue
            starts = record.since is None or record.since <= key
            if after.since is not None:
                ends = key <= after.since
            else:  # changed before the sink's first mark: it held letters of no later batch
                marked = [r.since for r in found[at + 2 :] if r.since is not None]
                ends = not marked or key < marked[0]
            if starts and ends:
                texts.setdefault(target_digest(record.target), record.target)
        return list(texts.values())


def _batch_text(key: BatchKey | None) -> str:
    if key is None:
        return "its first batch"
    return f"batch {key[1]}" + (f" of epoch {key[0]}" if key[0] else "")


def earlier_letters(
    batch: Batch,
    texts: Sequence[str],
    now: DeadLetterTarget | None,
    sink: Sink,
    kinds: Mapping[str, DeadLetterKind],
    ledger: str,
) -> EarlierLetters:
    """Ask each earlier target (``texts``, as recorded) what it holds of ``batch``'s
    letters, before anything of the batch is written.

    :param now: the sink's target now (named in the error).
    :param kinds: the dead-letter kinds (each earlier target is built again by its kind's
        factory, with the sink).
    :param ledger: the ledger's location, for the ``fanout ledger skip`` the error names.
    :raises DeadLetterMovedError: a target that cannot be built (its kind gone, its
        location recorded masked) or read, or that cannot tell (no ``letters_held``),
        naming the sink, the batch, both targets and what to do.
    """
    held = tuple(_held(batch, text, now, sink, kinds, ledger) for text in texts)
    return EarlierLetters(batch.info.epoch, batch.batch_id, held)


def _held(
    batch: Batch,
    text: str,
    now: DeadLetterTarget | None,
    sink: Sink,
    kinds: Mapping[str, DeadLetterKind],
    ledger: str,
) -> HeldLetters:
    kind, location = split_target(text)
    if MASK in location:
        raise _cannot_tell(batch, text, now, "its location is recorded masked (it held a "
                           "password or a token)", ledger)  # fmt: skip
    factory = kinds.get(kind)
    if factory is None:
        raise _cannot_tell(batch, text, now, f"no installed plugin provides kind {kind!r}", ledger)
    try:
        target = factory(location, sink)
    except Exception as exc:
        raise _cannot_tell(batch, text, now, f"cannot be built: {exc}", ledger) from exc
    letters_held = getattr(target, "letters_held", None)
    if letters_held is None:
        why = f"a {kind} target cannot say which letters of a batch it holds"
        raise _cannot_tell(batch, text, now, why, ledger)
    try:
        held = letters_held(batch)
    except Exception as exc:
        why = f"cannot be read: {type(exc).__name__}: {exc}"
        raise _cannot_tell(batch, text, now, why, ledger) from exc
    if not isinstance(held, HeldLetters):
        raise _cannot_tell(batch, text, now, f"answered {held!r}", ledger)
    if held.refused and isinstance(target, ReplacesLetters):  # an upsert replay's place
        held = dataclasses.replace(held, replaces=target)
    return held


def _cannot_tell(
    batch: Batch, text: str, now: DeadLetterTarget | None, why: str, ledger: str
) -> DeadLetterMovedError:
    info = batch.info
    where = "no dead-letter target" if now is None else now.describe()
    return DeadLetterMovedError(
        f"its dead_letter changed since an attempt of this batch: it was {text!r} then, "
        f"it is {where} now, and {text!r} {why}. Writing the batch's dead letters to {where} "
        f"could keep a letter in both. Nothing was written. Restore dead_letter = {text!r} "
        f"until batch {info.batch_id} completes (its letters are then written once, where "
        "they are), or, to go on without it, record the batch for this sink with "
        f"`{skip_command(ledger, info.pipeline, batch.sink_name, info.batch_id, info.epoch)}` "
        "(what it did not write is then missing from the sink and its dead letters)",
        sink=batch.sink_name,
        batch_id=info.batch_id,
    )


def earlier_of(batch: Batch) -> EarlierLetters | None:
    """:attr:`fanout.Batch.earlier` when it is of this very batch (``None`` otherwise)."""
    earlier = batch.earlier
    if earlier is None or (earlier.epoch, earlier.batch_id) != (batch.info.epoch, batch.batch_id):
        return None
    return earlier


def refused_elsewhere(batch: Batch, partition: int | None) -> HeldLetters | None:
    """The earlier target of the sink holding ``batch``'s refused rows of write partition
    ``partition`` (``None``: refused without a partition), if one does."""
    earlier = earlier_of(batch)
    return None if earlier is None else earlier.refused(partition)


def write_letters(
    target: DeadLetterTarget,
    batch: Batch,
    letters: Sequence[DeadLetter],
    *,
    source: Source,
    partition: int | None = None,
    route: RouteStamp | None = None,
) -> int:
    """Hand ``letters`` of ``batch`` to ``target`` (``target.write``, with ``route`` for a
    route's letters, :func:`fanout.deadletters.route_letters.write_route_letters`), but
    none an earlier target of the sink holds (:attr:`fanout.Batch.earlier`): route
    letters it holds (their route compared as the target compares it: another route raises
    :func:`fanout.deadletters.route_letters.changed_route`), or refused rows of a write
    partition whose refused rows it holds (per letter's ``partition`` for a write of the
    batch's whole). Returns how many letters the batch has, kept where they are or written
    now."""
    target = unchecked(target)  # filtered here once, not again in its write
    earlier = earlier_of(batch)
    if earlier is None:
        return _write(target, batch, letters, source, partition, route)
    if source == "route":
        held = earlier.route()
        if held is None:
            return _write(target, batch, letters, source, partition, route)
        if route is not None:
            check_unchanged(
                batch, route, fingerprint=held.fingerprint, recorded=held.route_text,
                target=held.target,
            )  # fmt: skip
        _kept_before(batch, held.target, target, "route", len(letters))
        return len(letters)
    if partition is not None:
        kept = earlier.refused(partition)
        if kept is None:
            return _write(target, batch, letters, source, partition, route)
        _kept_before(batch, kept.target, target, f"partition {partition}'s", len(letters))
        return len(letters)
    fresh = _not_held(earlier, batch, letters, target, "refused")
    if fresh or not letters:
        _write(target, batch, fresh, source, partition, route)
    return len(letters)


def replace_letters(
    target: ReplacesLetters, batch: Batch, letters: Sequence[DeadLetter], *, source: Source
) -> int:
    """Make ``letters`` of ``batch`` (a replay's, which may refuse other rows than the
    attempt it replays: a PostgreSQL upsert) the batch's letters of ``source`` in ``target``
    (``target.replace``), but for the refused rows of the write partitions an earlier target
    of the sink holds (:attr:`fanout.Batch.earlier`): those go where the earlier attempt
    wrote them. An earlier target that can take letters back (a ``ReplacesLetters``,
    :attr:`fanout.contract.earlier_letters.HeldLetters.replaces`: a Delta table) gets the
    replay's letters of the partitions it holds in place of its own (none: removed), so a
    row the replay took is no dead letter there and one it refused is one; another keeps
    what it holds (docs/architecture.md §7, "Not covered"). Returns how many letters the
    batch has, kept where they are or written now."""
    target = unchecked(target)  # filtered here once, not again in its replace
    if earlier_of(batch) is None:
        return target.replace(batch, letters, source=source)
    target.replace(batch, replace_held(target, batch, letters, source=source), source=source)
    return len(letters)


def replace_held(
    now: DeadLetterTarget, batch: Batch, letters: Sequence[DeadLetter], *, source: Source
) -> list[DeadLetter]:
    """:func:`replace_letters`' part for the sink's earlier targets: of ``letters`` (a
    replay's, the batch's whole), those of the write partitions an earlier target holds go
    there, replacing its own in a ``ReplacesLetters`` (``HeldLetters.replaces``; source
    ``refused`` only), kept as they are in another; returns the rest, for the sink's target
    ``now`` (named in the log). A sink whose target takes letters inside its partitions'
    transactions (PostgreSQL's ``postgres:`` table, which skips the partitions an earlier
    target holds) hands it those partitions' letters after them. Without an earlier target
    of this batch: ``letters`` as they are."""
    now = unchecked(now)
    earlier = earlier_of(batch)
    if earlier is None:
        return list(letters)
    fresh: list[DeadLetter] = []
    theirs: list[list[DeadLetter]] = [[] for _ in earlier.held]
    for letter in letters:
        at = next((i for i, h in enumerate(earlier.held) if letter.partition in h.refused), None)
        (fresh if at is None else theirs[at]).append(letter)
    for held, mine in zip(earlier.held, theirs, strict=True):
        if source == "refused" and held.replaces is not None and held.refused:
            held.replaces.replace(batch, mine, source=source)
            _replaced_there(batch, held, now, len(mine))
        else:
            _kept_before(batch, held.target, now, source, len(mine))
    return fresh


def _replaced_there(batch: Batch, held: HeldLetters, target: DeadLetterTarget, count: int) -> None:
    numbers = sorted(held.refused, key=lambda p: -1 if p is None else p)
    parts = ", ".join("none" if p is None else str(p) for p in numbers)
    log.info(
        "pipeline %s, batch %s, sink %s: the %s dead letter(s) of this replay in partition(s) "
        "%s replace those an earlier attempt wrote to %s (its dead-letter target then), "
        "which keeps them; not written to %s",
        batch.pipeline, batch.batch_id, batch.sink_name, count, parts, held.target,
        target.describe(), extra=batch_fields(batch.pipeline, batch.batch_id, batch.sink_name),
    )  # fmt: skip


def _not_held(
    earlier: EarlierLetters,
    batch: Batch,
    letters: Sequence[DeadLetter],
    target: DeadLetterTarget,
    what: str,
) -> list[DeadLetter]:
    """The refused rows among ``letters`` whose write partition no earlier target holds;
    those it holds are logged as kept there."""
    for held in earlier.held:
        count = sum(1 for letter in letters if letter.partition in held.refused)
        _kept_before(batch, held.target, target, what, count)
    return [letter for letter in letters if earlier.refused(letter.partition) is None]


def _write(
    target: DeadLetterTarget,
    batch: Batch,
    letters: Sequence[DeadLetter],
    source: Source,
    partition: int | None,
    route: RouteStamp | None,
) -> int:
    if source == "route" and route is not None:
        return write_route_letters(target, batch, letters, route)
    if not letters and source == "route":
        return 0
    return target.write(batch, letters, source=source, partition=partition)


def _kept_before(batch: Batch, held: str, target: DeadLetterTarget, what: str, count: int) -> None:
    if not count:
        return
    log.info(
        "pipeline %s, batch %s, sink %s: %s %s dead letter(s) of this batch are kept in %s "
        "(its dead-letter target when an earlier attempt wrote them): not written to %s",
        batch.pipeline, batch.batch_id, batch.sink_name, count, what, held, target.describe(),
        extra=batch_fields(batch.pipeline, batch.batch_id, batch.sink_name),
    )  # fmt: skip


class CheckedTarget:
    """A sink's dead-letter target as fanout hands it over
    (:attr:`fanout.SinkContext.dead_letters`): its ``write`` is :func:`write_letters`, so
    a sink calling ``context.dead_letters.write(...)`` writes no letter an earlier target of
    the sink holds (:attr:`fanout.Batch.earlier`), as one handing them to
    :func:`write_letters` does (which writes through the target itself: filtered once).
    Everything else is the target's (``describe``, ``letters_held``, its own attributes),
    and it is an instance of the target's class (``isinstance(context.dead_letters,
    ItsTarget)``, as a plugin with a kind of its own asks); its ``type()`` is this class, and
    :func:`unchecked` gives the target itself. Picklable (by Spark's cloudpickle too), as the
    target is: it travels to the executors and stays a wrapper there.

    :param target: the target fanout resolved from the sink's ``dead_letter``.
    """

    kind: str  # the target's; unset (read through, so missing) when the target has none

    def __init__(self, target: DeadLetterTarget) -> None:
        self.target = target
        kind = getattr(target, "kind", None)
        if kind is not None:
            self.kind = kind

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance() asks it when type() is not the class
        return type(self.target)

    def __reduce__(self) -> tuple[Any, ...]:
        # type(self), not self.__class__ (the target's): pickle and copy rebuild the wrapper
        return type(self), (self.target,)

    def describe(self) -> str:
        """The target's description."""
        return self.target.describe()

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
        route: RouteStamp | None = None,
    ) -> int:
        """:func:`write_letters` to the target: none an earlier target of the sink holds."""
        return write_letters(
            self.target, batch, letters, source=source, partition=partition, route=route
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "target":  # pickle's probes, before __dict__
            raise AttributeError(name)
        return getattr(self.target, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.target!r})"


class CheckedReplacingTarget(CheckedTarget):
    """A :class:`CheckedTarget` of a target that can take letters back (a
    ``ReplacesLetters``): its ``replace`` is :func:`replace_letters`."""

    def replace(self, batch: Batch, letters: Sequence[DeadLetter], *, source: Source) -> int:
        """:func:`replace_letters` in the target: an earlier target's partitions there."""
        target = cast("ReplacesLetters", self.target)  # checked() made it so
        return replace_letters(target, batch, letters, source=source)


def checked(target: DeadLetterTarget | None) -> DeadLetterTarget | None:
    """``target`` as fanout hands it to a sink: a :class:`CheckedTarget` (``None`` stays)."""
    if target is None or isinstance(target, CheckedTarget):
        return target
    if isinstance(target, ReplacesLetters):
        return CheckedReplacingTarget(target)
    return CheckedTarget(target)


def unchecked(target: DeadLetterTarget | None) -> Any:
    """The target a :class:`CheckedTarget` wraps (any other, ``None`` too, as it is)."""
    return target.target if isinstance(target, CheckedTarget) else target
