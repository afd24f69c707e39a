"""What a PostgreSQL error means for the sink: worth a retry, a row's fault, or fatal; and
what to say about the server's own cancellations."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

TRANSIENT_STATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled: statement_timeout, or an operator's pg_cancel_backend
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "53300",  # too_many_connections
    "53400",  # configuration_limit_exceeded
}
"""SQLSTATEs a later attempt can succeed on; classes ``08`` (connection) are too, but for
:data:`NOT_TRANSIENT`."""
NOT_TRANSIENT = {
    "08P01",  # protocol_violation: e.g. a binary COPY field not of its column's type
}


HINTS = {
    "57014": "cancelled by statement_timeout or an operator; the batch is retried. If it "
    "repeats, raise statement_timeout for the sink's role or database (or in its "
    "'settings'), or write smaller partitions (option 'partitions')",
    "42804": "a column of the table changed type while the batch was written (the sink "
    "checks the table's types at each batch), to one the planned type has no assignment "
    "cast to; the batch fails rather than write a wrong value: run it again to plan it "
    "against the table as it is now",
    "P0001": "RAISE EXCEPTION without an ERRCODE, in a trigger or a function the statement "
    "called, is no row's fault to the sink: the partition fails at every attempt, "
    "dead_letter or not. To have the row refused (dead-lettered, or the batch failing "
    "naming it), raise it with a data error's code: RAISE EXCEPTION '...' USING ERRCODE = "
    "'check_violation' (any code of class 23 or 22)",
}


def classify(error: BaseException) -> str:
    """``transient`` (retry), ``data`` (a row's fault) or ``fatal``."""
    import psycopg2

    code = getattr(error, "pgcode", None)
    if code in NOT_TRANSIENT:
        return "fatal"
    if code in TRANSIENT_STATES or (code or "").startswith("08"):
        return "transient"
    if code and code[:2] in ("22", "23"):
        return "data"
    if isinstance(error, (psycopg2.OperationalError, psycopg2.InterfaceError)) and not code:
        return "fatal" if refused_login(error) else "transient"
    return "fatal"


_REFUSED_LOGIN = re.compile(
    r'authentication failed|(database|role) ".*" does not exist|no pg_hba\.conf entry'
)
"""A connection the server answered and refused for its ``url`` (a wrong password, a
database or role that does not exist, a host ``pg_hba.conf`` does not admit): psycopg2
gives these no SQLSTATE, and no later attempt succeeds until the configuration changes."""


def refused_login(error: BaseException) -> bool:
    """Whether ``error`` (a connection error without SQLSTATE) is the server refusing the
    ``url``'s credentials or database, not a server out of reach."""
    return _REFUSED_LOGIN.search(str(error)) is not None


_COPY_LINE = re.compile(r"^COPY .*?, line (\d+)(?:, column (.*))?", re.M)
"""COPY's own context line (``COPY t, line 3, column doc: "{bad"``). Contexts of the
input function or of a trigger come before it and may hold a ``line N`` of their own
(``JSON data, line 1: ...``, ``PL/pgSQL function f() line 3 at RAISE``); the value quoted
after it may span lines: the first line starting with ``COPY`` is COPY's."""


class RowRejected(Exception):
    """A row was rejected and no dead-letter target is configured."""

    def __init__(self, detail: dict[str, Any]) -> None:
        super().__init__(detail["reason"])
        self.detail = detail


class MarkConflict(Exception):
    """A progress mark from another query or partitioning."""


def copy_position(exc: BaseException, columns: Sequence[str] = ()) -> tuple[int | None, str | None]:
    """The line (as COPY counts it, see :func:`fanout_postgres.encode.row_at_line`) and
    the column of the row a COPY refused, from the error's context. The context names the
    column unquoted, then ``": "`` and the value: the longest of ``columns`` it starts with
    is the column (a name may hold ``": "`` itself), else the text up to the first ``": "``."""
    context = getattr(getattr(exc, "diag", None), "context", None) or ""
    match = _COPY_LINE.search(context)
    if not match:
        return None, None
    rest = match.group(2)
    if rest is None:
        return int(match.group(1)), None
    named = [c for c in columns if rest == c or rest.startswith(c + ": ")]
    return int(match.group(1)), max(named, key=len) if named else rest.split(": ", 1)[0]


def sqlstate_of(exc: BaseException) -> str | None:
    return getattr(exc, "pgcode", None)


def reason_of(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) or str(exc).strip().splitlines()[0]
    detail = getattr(diag, "message_detail", None)
    if detail and not detail.startswith("Failing row contains"):
        return f"{primary} ({detail})"
    return str(primary)
