"""The texts of a batch a sink holds without its mark: the start's refusal
(:func:`refusal_message`) and its ways out, which ``fanout recover`` prints too
(:func:`choice_lines`, :func:`partial_lines`), the refusal of the refused query started
again (:func:`restart_message`, :func:`wrote_message`), and the warning of a harmless
rewrite (:data:`REWRITE_WARNING`)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from fanout.contract.batch import BatchInfo
from fanout.errors import shell_word
from fanout.ledger.entry import Ledger, ledger_location
from fanout.ledger.gaps import skip_command
from fanout.steps.unmarked.held import Held


def refusal_message(
    info: BatchInfo,
    ledger: Ledger,
    held: list[Held],
    refused: list[Held],
    answers: list[Held],
    marks: Mapping[str, int | None],
    offsets: Mapping[str, str | None],
) -> str:
    """The refusal: ``refused``, the sinks of ``held`` (every sink holding its batch after
    its mark) whose rewrite of it is not harmless."""
    epoch, new, pipeline = info.epoch, info.epoch + 1, info.pipeline
    where = ledger_location(ledger)
    recover = f"fanout recover --ledger {where} --pipeline {shell_word(pipeline)}"
    unknown = {a.sink for a in answers if a.holds is None}
    whole = [h for h in refused if h.part is None]
    lines = [
        f"pipeline {pipeline!r}: query {info.query_id} cannot start epoch {new}: "
        + ", ".join(
            f"sink {h.sink} holds "
            + (f"batch {h.mark + 1}" if h.part is None else f"part of batch {h.mark + 1}")
            for h in refused
        )
        + f" of epoch {epoch} by its own records, and the ledger had no mark of it (the "
        "write committed, the mark did not: the driver died in between, or the query was "
        "stopped mid-batch). A reset resumes after the last marked batch, so the new epoch "
        "would read that input again and write those rows a second time under new "
        f"transaction ids. Nothing was written under epoch {new}"
        + ("; the ledger now records the lost mark (the sink holds the batch)." if whole else ".")
        + "".join(
            f" Sink {h.sink} holds batch {h.mark + 1} too (mark recorded), but writing it "
            f"again changes nothing there: {h.harmless}."
            for h in held
            if h.harmless is not None
        )
    ]
    for h in refused:
        if h.part is not None:
            lines += partial_lines(pipeline, epoch, where, h, offsets[h.sink], marks)
        else:
            lines += choice_lines(pipeline, epoch, where, h, offsets[h.sink], marks, held, unknown)
    lines.append(
        f"Stop every query of this pipeline, run `{recover}` again, and start the new "
        "query from the offsets it prints (on a new checkpoint when they are not this "
        "checkpoint's start)."
    )
    return "\n".join(lines)


def epoch_began(batch: int) -> str:
    """Where an epoch whose first batch is ``batch`` began: what a new checkpoint resuming
    before that batch starts from (the ledger holds no offsets of it)."""
    if batch == 0:
        return "the query's starting offsets"
    return f"the replaced checkpoint's offsets/{batch - 1} file"


def lacking_sinks(
    batch: int, marks: Mapping[str, int | None], holding: Sequence[Held]
) -> list[str]:
    """The sinks without ``batch``: by ``marks`` (each sink's mark before the lost ones,
    ``None``: no mark), and not among ``holding`` (the sinks found holding their batch after
    their mark)."""
    return [
        name
        for name, mark in sorted(marks.items())
        if (mark is None or mark < batch)
        and not any(a.sink == name and a.whole and a.mark + 1 == batch for a in holding)
    ]


def choice_lines(
    pipeline: str,
    epoch: int,
    where: str,
    held: Held,
    known: str | None,
    marks: Mapping[str, int | None],
    holding: Sequence[Held],
    unknown: Collection[str],
    *,
    refusal: bool = True,
) -> list[str]:
    """The lines naming the batch ``held.sink`` holds after its mark without a mark of it
    (``known``: its source offsets, when another sink marked it), the sinks without it
    (``marks``: each sink's mark in ``epoch`` before the lost one; ``holding``: every sink
    found holding its batch after its mark; ``unknown``: the sinks that cannot tell), and
    the operator's two ways out with their consequences. The refusal
    (:class:`fanout.UnmarkedBatchError`) and ``fanout recover --config`` print them.

    :param where: the ledger, as a command names it
        (:func:`fanout.ledger.entry.ledger_location`).
    :param refusal: the lines of a refused query's message (``False``: of ``fanout
        recover``, where no query was refused).
    """
    h, batch = held, held.mark + 1
    recover = f"fanout recover --ledger {where} --pipeline {shell_word(pipeline)}"
    lacking = lacking_sinks(batch, marks, holding)
    listed = ", ".join(
        f"{name} ("
        + ("no mark" if marks[name] is None else f"mark {marks[name]}")
        + (", cannot tell" if name in unknown else "")
        + ")"
        for name in lacking
    )
    lines = [
        f"- sink {h.sink}: batch {batch} of epoch {epoch}, "
        + (f"source offsets {known}" if known else "source offsets unknown (no sink marked it)")
        + f"; sinks without it: {listed or 'none'}."
        # not when a sink wrote and marked the batch: the refused query would write it
        # there again, and recover, counting the lost mark, resumes after the batch
        + ("" if h.hint is None or _marked(marks, batch) else f" {h.hint}")
    ]
    if not lacking:
        if not known:
            lines.append(
                f"  Every sink holds batch {batch}, so resume after it; `{recover}` "
                "cannot print its offsets (no sink marked it): the replaced checkpoint's "
                f"offsets/{batch} file holds them (one JSON line per source, after the "
                "first two lines)."
                + (" This query's checkpoint starts before it: start a new one." if refusal else "")
                + (
                    f" Or remove {h.sink}'s copy as said above and start this query again, not "
                    "a new checkpoint (the ledger counts the batch as held by "
                    f"{h.sink} now: a new checkpoint after it never gives it the batch)."
                    if refusal and h.hint is not None and not _marked(marks, batch)
                    else ""
                )
            )
        return lines
    skip = " ".join(f"`{skip_command(where, pipeline, name, batch, epoch)}`" for name in lacking)
    if marks[h.sink] is not None or any(m is not None for m in marks.values()):
        resume = f"Resume after batch {h.mark}, where `{recover}` counts {', '.join(lacking)}"
    else:
        unmarked = ", ".join(name for name in lacking if marks[name] is None)
        resume = (
            f"Resume at epoch {epoch}'s start, before its first batch {batch} (where it "
            f"began: {epoch_began(batch)}; `{recover} --config PIPELINE.toml` says so, "
            f"counting {unmarked}, which has no mark: without --config it does not see "
            f"{unmarked} and says resume after batch {batch}, which is choice 2 without "
            "its skip)"
        )
    return [
        *lines,
        f"  1. {resume}: {h.sink} gets batch {batch}'s rows a second time (unless its copy "
        "is removed first).",
        f"  2. Or give batch {batch} up for {', '.join(lacking)}: {skip}, then resume "
        f"after batch {batch}: they never get its rows.",
    ]


def partial_lines(
    pipeline: str,
    epoch: int,
    where: str,
    held: Held,
    known: str | None,
    marks: Mapping[str, int | None],
) -> list[str]:
    """The lines naming the batch ``held.sink`` holds only part of (``held.part``), why no
    lost mark is recorded, and the ways out: the old checkpoint's restart completes the
    batch; without it, a skip and a resume before the batch (the committed part twice) or
    after it (the rest never). The refusal and ``fanout recover --config`` print them.

    :param known: the batch's source offsets, when another sink marked it.
    :param marks: each sink's mark in ``epoch`` (``None``: no mark).
    """
    assert held.part is not None
    h, batch, part = held, held.mark + 1, held.part
    rest = (
        "the other partitions"
        if part.partitions is None
        else f"the other {part.partitions - part.committed} of {part.partitions} partitions"
    )
    rows = f"{rest}' rows"
    if part.whole_rows:  # only dead letters are missing
        rest = rows = f"the {part.letters} refused row(s) its partitions kept for the dead letters"
    elif part.letters:
        rest += f" and the {part.letters} refused row(s) kept for the dead letters"
        rows = rest
    skip = f"`{skip_command(where, pipeline, h.sink, batch, epoch)}`"
    marked = sorted(n for n, m in marks.items() if n != h.sink and m is not None and m >= batch)
    twice = (
        f" ({', '.join(marked)} marked batch {batch}: "
        f"{'it gets' if len(marked) == 1 else 'they get'} it a second time too)"
        if marked
        else ""
    )
    before = (
        f"after batch {h.mark}"
        if marks.get(h.sink) is not None
        else f"at epoch {epoch}'s start ({epoch_began(batch)})"
    )
    return [
        f"- sink {h.sink}: part of batch {batch} of epoch {epoch}, {part.text()} committed"
        f"{part.letters_text()} (by its own records); no lost mark is recorded for it: a "
        f"mark says the sink holds the whole batch, and a replay of batch {batch} would then "
        f"skip {rest}.",
        "  1. Restart the query on its old checkpoint (the one that wrote the batch, not a "
        f"new one, and without a reset): it replays batch {batch}, skips the {part.committed} "
        f"committed partitions and writes {rest}: nothing lost, nothing twice.",
        "  If that checkpoint is gone (the sink keeps being asked about the batch until its "
        f"ledger mark reaches it, so first {skip}):",
        f"  2. Resume {before}: {h.sink} gets the {part.committed} committed "
        f"partitions' rows of batch {batch} a second time{twice}.",
        f"  3. Or resume after batch {batch} ({_after(batch, known)}): {h.sink} never gets "
        f"{rows} of batch {batch}.",
    ]


def _marked(marks: Mapping[str, int | None], batch: int) -> bool:
    """Whether a sink's ledger mark (before any lost mark was recorded) reaches ``batch``."""
    return any(mark is not None and mark >= batch for mark in marks.values())


def _after(batch: int, offsets: str | None) -> str:
    """Where a new checkpoint resuming after ``batch`` starts."""
    return (
        f"the source offsets of batch {batch}: {offsets}"
        if offsets
        else f"the source offsets of batch {batch}, which the ledger does not hold (no sink "
        f"marked it): the replaced checkpoint's offsets/{batch} file holds them (one JSON "
        "line per source, after the first two lines)"
    )


def wrote_message(
    info: BatchInfo, ledger: Ledger, lost: list[str], wrote: list[str], batch: int,
    offsets: str | None,
) -> str:  # fmt: skip
    """The refusal of a refused query started again when sinks ``wrote`` marked the batch
    it was refused for: its checkpoint starts before that batch, so they would get it twice
    whatever became of the lost marks' copies
    (:func:`~fanout.steps.unmarked.restart.refuse_restart`)."""
    epoch, pipeline = info.epoch, info.pipeline
    return (
        f"pipeline {pipeline!r}: query {info.query_id} cannot start epoch {epoch + 1}: it was "
        f"refused before because sink {', '.join(lost)} held batch {batch} of epoch {epoch} "
        f"unmarked, so its checkpoint starts before that batch, and sink {', '.join(wrote)} "
        f"wrote and marked batch {batch}: started again, this query would write batch "
        f"{batch}'s rows a second time there. Nothing was written under epoch {epoch + 1}. "
        f"Start a new checkpoint (not this one) that reads what comes after "
        f"{_after(batch, offsets)} (`fanout recover --ledger {ledger_location(ledger)} "
        f"--pipeline {shell_word(pipeline)}` resumes after it; if a copy of batch {batch} was "
        "removed from a sink since, that sink lacks the batch: give it to it by hand)."
    )


def restart_message(
    info: BatchInfo, ledger: Ledger, held: list[Held], batch: int, offsets: str | None
) -> str:
    """The refusal of a refused query started again
    (:func:`~fanout.steps.unmarked.restart.refuse_restart`)."""
    epoch, pipeline, names = info.epoch, info.pipeline, ", ".join(h.sink for h in held)
    where = _after(batch, offsets)
    lines = [
        f"pipeline {pipeline!r}: query {info.query_id} cannot start epoch {epoch + 1}: it was "
        f"refused before because sink {names} held batch {batch} of epoch {epoch} unmarked, "
        f"so its checkpoint starts before that batch; every sink now counts batch {batch} "
        f"(`fanout recover --ledger {ledger_location(ledger)} --pipeline {shell_word(pipeline)}` "
        "resumes "
        f"after it), and {names} still holds it: started again, this query would write batch "
        f"{batch}'s rows a second time there. Nothing was written under epoch {epoch + 1}.",
        f"Start a new checkpoint (not this one) that reads what comes after {where}. Or "
        f"remove {names}'s copy of batch {batch} so that the sink's own records no longer "
        "hold it (a Delta table: a restore to a version before the batch's commit), and "
        "start this query again: it passes, and writes the batch once."
        + "".join(f" {h.sink}: {h.hint}" for h in held if h.hint is not None),
    ]
    return "\n".join(lines)


REWRITE_WARNING = (
    "pipeline %s, sink %s: holds batch %s of epoch %s by its own records without its "
    "ledger mark (the driver died between the write and the mark); the ledger now "
    "records the lost mark. Epoch %s starts anyway and may write that batch's rows to "
    "the sink again, which changes nothing: %s"
)
"""The warning of a sink that holds the batch after its mark and takes it again harmlessly
(:meth:`fanout.Sink.harmless_rewrite`), its lost mark recorded; its arguments: the
pipeline, the sink, the batch, the replaced epoch, the new one, the sink's reason."""
