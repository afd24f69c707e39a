"""Whether a fenced attempt of a partition can have a rival: another attempt of the same
Spark task, running beside it, that may commit the batch and whose outcome Spark may take
in place of this one's (docs/architecture.md §8.3, "Two attempts at once").

A fenced attempt waits for such a rival's marker (up to ``transaction_timeout_ms``) only
when one can exist: Spark runs two attempts of one task at once under speculation, and
a retried task (attempt number above 0) may have a predecessor still running (a zombie
on an executor Spark gave up on). Without either, nothing Spark runs can commit the
partition, so the fencing came from outside this query (the coordinator's timeout, or
another writer on the same transactional ids) and waiting would only delay the failure by
a minute. Not seen from Python: a retried *stage* (its tasks' attempt numbers start at 0
again; PySpark's ``TaskContext`` has no stage attempt number), whose zombie predecessor
would have to open a second producer after this attempt's (to redo a transaction) and
commit: this attempt then fails instead of being skipped, and the restarted query's replay
skips the partition its zombie wrote."""

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


UNKNOWN_ATTEMPT = -1
"""A task whose attempt number could not be read: a rival is assumed."""


def task_attempt() -> int | None:
    """The attempt number of the Spark task running this code (:data:`UNKNOWN_ATTEMPT`
    when it cannot be read), ``None`` outside a task (the driver)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        return None if context is None else int(context.attemptNumber())
    except ImportError:  # no Spark here: no task
        return None
    except Exception:  # a context that does not answer: a rival is assumed
        return UNKNOWN_ATTEMPT


def rival_reason(speculation: bool | None, attempt: int | None) -> str | None:
    """Why another attempt of this partition may be running and commit the batch, or
    ``None`` when none can: speculation off (known), and this is the task's first attempt
    (or no task: the driver)."""
    if speculation is None:
        return "spark.speculation unknown"
    if speculation:
        return "spark.speculation is on"
    if attempt == UNKNOWN_ATTEMPT:
        return "the task's attempt number unknown"
    if attempt:
        return f"task attempt {attempt}: an earlier attempt may still run"
    return None


def lone_fencing(transactional_id: str, attempt: int | None) -> str:
    """The sentence added to a fenced partition's failure when no rival can exist."""
    where = "the driver" if attempt is None else f"task attempt {attempt}"
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
