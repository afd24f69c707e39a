"""``fanout run PIPELINE.toml --new-epoch``: accept a checkpoint reset for this run only.

The flag builds the run's ``FanOut`` with ``on_checkpoint_reset="new_epoch"`` (a new or
replaced checkpoint continues under a new epoch); the pipeline file has no such setting, so
a later run without the flag refuses resets again. Before anything starts, the run checks
that there is a reset to accept (:func:`check_new_epoch`): a checkpoint the pipeline's
current epoch already belongs to (no reset; also the run after the one that started the new
epoch, or a script that kept the flag), one of another pipeline's query (two pipelines
sharing a checkpoint) and a pipeline the ledger holds nothing of (a first run, or a misspelt
name or ledger path) are refused with a configuration error, so the flag
cannot stay on a command line that then silently starts a new epoch at some later reset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.app.config import PipelineConfig
from fanout.errors import ConfigurationError, LedgerError, shell_word

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


def check_new_epoch(config: PipelineConfig, path: str) -> str:
    """What ``fanout run --new-epoch`` will do with ``config``'s checkpoint, as the line the
    run prints; raises :class:`fanout.ConfigurationError` when there is no reset to accept.

    The checkpoint's query id (its ``metadata`` file) against the owner of the pipeline's
    current epoch in the ledger: the same query, no reset (refused); no metadata (a new
    checkpoint) or another query id, a reset the run's first batch accepts (the checkpoint
    guard still refuses a rolled-back checkpoint, or the query of an earlier epoch)."""
    from fanout.ledger.delta import DeltaLedger
    from fanout.steps.context import checkpoint_query_id

    ledger = DeltaLedger(config.ledger)
    without = f"run `fanout run {shell_word(path)}` without --new-epoch"
    try:
        names = ledger.pipelines()
        known = config.name in names
        epoch = ledger.current_epoch(config.name)
        owners = ledger.epoch_owners(config.name)
    except LedgerError as exc:
        raise ConfigurationError(
            f"--new-epoch: {exc}; a new epoch continues a pipeline the ledger holds: check "
            f"pipeline.ledger in {path}, or {without} for a first run"
        ) from None
    if not known:
        raise ConfigurationError(
            f"--new-epoch: the ledger at {config.ledger} holds nothing of pipeline "
            f"{config.name!r}: there is no epoch to continue from (a first run starts epoch "
            f"0 by itself; check pipeline.name and pipeline.ledger in {path}); {without}"
        )
    try:
        query = checkpoint_query_id(config.checkpoint)
    except (OSError, ValueError) as exc:  # a store pyarrow cannot read: the guard decides
        return (
            f"--new-epoch: the checkpoint at {config.checkpoint} could not be read ({exc}): "
            f"if it is new or replaced, its first batch starts epoch {epoch + 1}"
        )
    owner = owners.get(epoch)
    if query is not None and query == owner:
        _refuse_rolled_back(ledger, config, path, epoch, query)
        if ledger.high_water(config.name, epoch) is None:
            # the run that started the epoch died in its first batch: "not reset" misled
            raise ConfigurationError(
                f"--new-epoch: epoch {epoch} of pipeline {config.name!r} was started with the "
                f"checkpoint at {config.checkpoint} (query {query}) by a run that stopped "
                "before any sink marked a batch of it (killed, or failed): there is no other "
                f"epoch to start; {without}, it continues epoch {epoch} from its first batch"
            )
        raise ConfigurationError(
            f"--new-epoch: the checkpoint at {config.checkpoint} is the one epoch {epoch} of "
            f"pipeline {config.name!r} belongs to (query {query}): it was not reset, so there "
            f"is no new epoch to start; {without} (it continues epoch {epoch}; a rolled-back "
            "checkpoint is refused with or without the flag)"
        )
    older = [e for e, q in owners.items() if q == query and e < epoch]
    if query is not None and older:
        raise ConfigurationError(
            f"--new-epoch: the checkpoint at {config.checkpoint} is of query {query}, whose "
            f"batches are epoch {older[0]} of pipeline {config.name!r}, but the pipeline "
            f"continues under epoch {epoch}: an old checkpoint restored, which no new epoch "
            "may take (the later epoch's query already wrote the input it would plan next); "
            "restore the newest checkpoint and run without --new-epoch, or start a new "
            "checkpoint (`fanout recover --config` prints where it must resume)"
        )
    if query is not None:
        _refuse_shared(ledger, config, path, query, [n for n in names if n != config.name])
    found = "new (no query has run on it yet)" if query is None else f"of query {query}"
    return (
        f"--new-epoch: the checkpoint at {config.checkpoint} is {found}, not epoch {epoch}'s "
        f"({'query ' + owner if owner else 'owner not recorded'}): its first batch starts "
        f"epoch {epoch + 1}, for this run only (later runs refuse resets again)"
    )


def _refuse_shared(
    ledger: DeltaLedger, config: PipelineConfig, path: str, query: str, others: list[str]
) -> None:
    """Refuse when the checkpoint's ``query`` owns an epoch of another pipeline of the
    ledger (``others``): a pipeline file copied with the first one's checkpoint. Taken for a
    reset, the run would move that pipeline's checkpoint past batches its sinks never get."""
    for other in others:
        epochs = [e for e, q in sorted(ledger.epoch_owners(other).items()) if q == query]
        if epochs:
            raise ConfigurationError(
                f"--new-epoch: the checkpoint at {config.checkpoint} is of query {query}, "
                f"whose batches are epoch {epochs[-1]} of pipeline {other!r} in this ledger, "
                f"not of pipeline {config.name!r}: two pipelines sharing one checkpoint, "
                "which no new epoch may take (the batches it plans next are pipeline "
                f"{other!r}'s); give pipeline {config.name!r} a checkpoint of its own "
                f"(pipeline.checkpoint in {path}), then run with --new-epoch"
            )


def _refuse_rolled_back(
    ledger: DeltaLedger, config: PipelineConfig, path: str, epoch: int, query: str
) -> None:
    """Refuse, saying so, when the epoch's own checkpoint is rolled back: its newest batch
    (``offsets/``) is before the ledger's high-water mark of the epoch, or it holds none (a
    reset by hand that kept ``metadata``). Spark then re-plans batches the sinks hold, which
    the guard refuses with or without the flag; "not reset, run without it" misled."""
    from fanout.steps.context import latest_batch_id

    high = ledger.high_water(config.name, epoch)
    try:
        newest = latest_batch_id(config.checkpoint, "offsets")
    except (OSError, ValueError):  # unreadable: the guard decides
        return
    if high is None or (newest is not None and newest >= high):
        return
    holds = "it holds no batch" if newest is None else f"its newest batch is {newest}"
    raise ConfigurationError(
        f"--new-epoch: the checkpoint at {config.checkpoint} is the one epoch {epoch} of "
        f"pipeline {config.name!r} belongs to (query {query}), rolled back: {holds}, and "
        f"the ledger holds batch {high} of epoch {epoch}, so Spark re-plans batches the "
        "sinks hold, which is refused with or without --new-epoch "
        "(CheckpointRollbackError); restore the newest checkpoint and run "
        f"`fanout run {shell_word(path)}` without --new-epoch, or start a new checkpoint in an "
        "empty "
        f"directory where `fanout recover --config {shell_word(path)}` says and run with "
        "--new-epoch"
    )
