"""The Delta sink's epoch fence hooks: closing the app transactions of the epochs before a
start's (:meth:`fanout.Sink.fence_earlier_epochs`), and lifting the last one's
(:meth:`fanout.Sink.lift_epoch_fence`), with what the sink logs of each. The commits
themselves: :mod:`fanout_delta.fence`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

# The sink's logger: its records keep the name users' logging settings give.
logger = logging.getLogger("fanout_delta.sink")


def fence_earlier_epochs(
    sink: str,
    path: str,
    storage_options: Mapping[str, str] | None,
    pipeline: str,
    epoch: int,
    secrets: Callable[[], Sequence[str]],
) -> None:
    """Close sink ``sink``'s app transactions of epochs ``0 .. epoch-1`` in the table at
    ``path``: one commit without rows marking each one not fenced yet. A table delta-rs
    cannot commit to (engine spark) is left unfenced, with a warning (what ``secrets``
    returns scrubbed from the error it quotes). Done either way, unless it raises."""
    from fanout.contract.batch import txn_app_id
    from fanout.observe.secrets import redact
    from fanout_delta.fence import fence_epochs, unfenceable

    app_ids = {e: txn_app_id(pipeline, sink, e) for e in range(epoch)}
    try:
        fenced = fence_epochs(path, storage_options, app_ids, epoch)
    except Exception as exc:
        if not unfenceable(exc):
            raise
        logger.warning(
            "sink %r: epochs before %d are not fenced in the Delta table %s: delta-rs "
            "cannot commit to it (%s). A driver of a replaced epoch still running may "
            "commit its batch in flight there after this start, beside the new epoch's "
            "(the ledger detects it: ZombieBatchError). Stop the replaced query before "
            "a checkpoint reset (docs/architecture.md §8.1).",
            sink, epoch, path, redact(str(exc), secrets()),
        )  # fmt: skip
        return
    if fenced:
        logger.info("sink %r: fenced %d app transaction(s) of epochs before %d in %s",
                    sink, fenced, epoch, path)  # fmt: skip


def lift_epoch_fence(
    sink: str, path: str, storage_options: Mapping[str, str] | None, pipeline: str, epoch: int
) -> bool:
    """Commit the real version of sink ``sink``'s app transaction of epoch ``epoch - 1``
    back over its fence in the table at ``path``. Whether there was a fence (``False``:
    none in its log, or a table delta-rs cannot read)."""
    from fanout.contract.batch import txn_app_id
    from fanout_delta.fence import lift_fence, unfenceable

    app_id = txn_app_id(pipeline, sink, epoch - 1)
    try:
        lifted = lift_fence(path, storage_options, app_id)
    except Exception as exc:
        if not unfenceable(exc):
            raise
        # delta-rs cannot load it: it could not commit a fence there either
        logger.info("sink %r: no fence to lift in %s (delta-rs cannot read it)",
                    sink, path)  # fmt: skip
        return False
    if lifted:
        logger.info("sink %r: lifted the fence of %s in %s", sink, app_id, path)
    return lifted
