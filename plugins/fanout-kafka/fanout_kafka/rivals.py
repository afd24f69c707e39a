"""Whether a fenced attempt of a partition can have a rival: another attempt of the same
Spark task, running beside it, that may commit the batch and whose outcome Spark may take
in place of this one's (docs/architecture.md §8.3, "Two attempts at once").

A fenced attempt waits for such a rival's marker (up to ``transaction_timeout_ms``) only
when one can exist: Spark runs two attempts of one task at once under speculation, and
a retry (a later task attempt, or a task of a retried stage) may have a predecessor still
running (a zombie on an executor Spark gave up on). Without either, nothing Spark runs can
commit the partition, so the fencing came from outside this query (the coordinator's
timeout, or another writer on the same transactional ids) and waiting would only delay the
failure by a minute."""

from __future__ import annotations

from typing import Any

SPECULATION_CONF = "spark.speculation"


def speculation_of(df: Any) -> bool | None:
    """Whether the session of ``df`` runs speculative task attempts (``spark.speculation``);
    ``None`` when it cannot be told (no DataFrame, or its conf unreadable)."""
    if df is None:
        return None
    try:
        value = df.sparkSession.conf.get(SPECULATION_CONF, "false")
    except Exception:  # a session that does not answer: unknown, so a rival is assumed
        return None
    return str(value).strip().lower() == "true"


def task_attempt() -> tuple[int, int] | None:
    """``(stage attempt, task attempt)`` of the Spark task running this code, ``None``
    outside a task (the driver)."""
    try:
        from pyspark import TaskContext
    except ImportError:  # no Spark here: no task
        return None
    context = TaskContext.get()
    if context is None:
        return None
    return context.stageAttemptNumber(), context.attemptNumber()


def rival_reason(speculation: bool | None, attempt: tuple[int, int] | None) -> str | None:
    """Why another attempt of this partition may be running and commit the batch, or
    ``None`` when none can: speculation off (known), and this is the first attempt of
    the task in the first attempt of its stage (or no task: the driver)."""
    if speculation is None:
        return "spark.speculation unknown"
    if speculation:
        return "spark.speculation is on"
    if attempt is not None and attempt != (0, 0):
        stage, task = attempt
        return f"task attempt {task} of stage attempt {stage}: an earlier attempt may still run"
    return None


def lone_fencing(transactional_id: str, attempt: tuple[int, int] | None) -> str:
    """The sentence added to a fenced partition's failure when no rival can exist."""
    where = "the driver"
    if attempt is not None:
        where = f"task attempt {attempt[1]} of stage attempt {attempt[0]}"
    return (
        f"; no other attempt of this partition can be running ({where}, {SPECULATION_CONF} "
        "off), so no rival's commit was waited for: the fencing came from outside this "
        "query: the broker's transaction coordinator aborted the transaction (it outlived "
        "the coordinator's transaction timeout: raise `transaction_timeout_ms`), or another "
        f"pipeline or process initialised transactional id {transactional_id!r} (give each "
        "its own `transactional_id_prefix`). The batch fails; restarting the query replays "
        "it, and partitions that hold it are skipped"
    )


__all__ = ["lone_fencing", "rival_reason", "speculation_of", "task_attempt"]
