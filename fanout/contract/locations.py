"""Which local path a location names: a plain path, or a ``file:`` URL, read as delta-rs
reads a table's location.

Hadoop (and so Spark's resolved checkpoint paths) writes ``file:/x y`` unescaped: a
``%20`` there is part of a name. Such a location is not for this function.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

from fanout.errors import shell_word


def local_path(location: str) -> str | None:
    """The local (or mounted) filesystem path ``location`` names, ``None`` for a URI of
    any other scheme (an object store, HDFS).

    A plain path is taken as it is. A ``file:`` URL is decoded as delta-rs decodes a
    table's: ``file:///x``, ``file://localhost/x`` and ``file:/x`` name ``/x``, and their
    percent escapes are undone (``file:/tmp/my%20lake`` names ``/tmp/my lake``); as for
    delta-rs, a ``#`` or ``?`` ends the path (the files must go where its log says).
    """
    if location.startswith("file:"):
        return unquote(urlsplit(location).path) or "/"
    if "://" in location:
        return None
    return location


def uncreatable_directory(local: str) -> str | None:
    """Why no directory can be created at the missing local path ``local``, or ``None``:
    its nearest existing ancestor is a file. Without this check a table there failed only
    at its first write (a sink's first batch, a dead letter's first refused row, perhaps
    weeks later) with delta-rs' "Could not create local directory"; a checkpoint there,
    with a Java traceback when Spark started the query. Permissions are not
    checked (the tests and many drivers run as root, whom ``os.access`` always lets in)."""
    if os.path.exists(local):
        return None
    ancestor = os.path.dirname(os.path.abspath(local))
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        return (
            f"{ancestor!r} is a file, so no directory can be created under it; give a "
            "path under a directory"
        )
    return None


def unwritable_directory(local: str) -> str | None:
    """Why this process cannot make or write a directory at the local path ``local``, or
    ``None``: the path, when it is there, else its nearest existing ancestor, is not
    writable (or not searchable) by the process's effective user, so Spark could not
    create a checkpoint there or write into it (a Hadoop traceback at the query's start).
    A user whom the permissions let in (root) passes, as the writes would."""
    nearest = os.path.abspath(local)
    while not os.path.exists(nearest) and os.path.dirname(nearest) != nearest:
        nearest = os.path.dirname(nearest)
    effective = os.access in os.supports_effective_ids
    if os.access(nearest, os.W_OK | os.X_OK, effective_ids=effective):
        return None
    made = "write into it" if nearest == os.path.abspath(local) else "create a directory in it"
    return (
        f"permission denied: {nearest!r} does not let this user (uid {os.geteuid()}) "
        f"{made}; give a path it can write, or grant it write access there"
    )


def command_location(location: str) -> str:
    """How a command fanout prints (``fanout ledger skip --ledger ...``) names ``location``,
    so that it runs from any directory: a plain local path made absolute (from the current
    directory, where fanout opens it), a URI of any scheme (``file:`` included) as written,
    less the password of a ``user:password@`` in it (printed commands never carry a secret);
    quoted for a POSIX shell where it needs to be (``'/data/my lake'``). A location that is
    not a path at all (an in-memory ledger's name) is not for this function."""
    if location.startswith("file:") or "://" in location:
        return shell_word(shown_location(location))
    return shell_word(os.path.abspath(location))


_USER_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@]*):([^@]*)@")
"""``scheme://user:password@``, the password read as SQLAlchemy and libpq read it: up to the
first ``@``, whatever it holds (an unescaped ``/``, ``?`` or ``#`` too, which ends the
authority for :func:`urllib.parse.urlsplit`, so that its ``password`` is a part of it)."""


_AUTHORITY_END = re.compile(r"[/?#]")


def written_password(uri: str) -> str | None:
    """The password of ``uri``'s ``scheme://user:password@`` as written (``None``: none)."""
    match = _USER_PASSWORD.match(uri.strip())
    return match.group(2) if match and match.group(2) else None


def _password_end(uri: str) -> tuple[int, int] | None:
    """Where the password of ``uri`` (stripped) starts, and where it ends read to the
    authority's last ``@`` (the first ``/``, ``?`` or ``#`` after its first ``@`` ends the
    authority): ``None`` without a ``user:password@``."""
    match = _USER_PASSWORD.match(uri)
    if match is None:
        return None
    end = _AUTHORITY_END.search(uri, match.end())
    return match.start(2), uri.rfind("@", 0, end.start() if end else len(uri))


def written_passwords(uri: str) -> list[str]:
    """Every reading of the password of ``uri``'s ``scheme://user:password@``: up to its
    first ``@`` (:func:`written_password`, as SQLAlchemy reads it); and, where the
    authority holds another ``@`` (a password with an ``@`` not written ``%40``), up to
    its last one and each part between them: a reader that ends the password at the first
    ``@`` takes the rest for the host and quotes it (``could not translate host name
    "rest@db"``). ``[]``: no password."""
    text = uri.strip()
    first, span = written_password(text), _password_end(text)
    if first is None or span is None:
        return []
    whole = text[span[0] : span[1]]
    found = [first] if whole == first else [first, whole, *whole.split("@")]
    return [part for part in dict.fromkeys(found) if part]


SECRET_QUERY_WORDS = frozenset(
    {"sig", "signature", "password", "passwd", "pwd", "secret", "token", "key", "credential"}
)
"""Words that make a URI's query parameter a secret where one of its name's parts (split at
``-``, ``_``, ``.`` and camelCase, a plural ``s`` allowed) is one: an Azure SAS's ``sig``,
a presigned S3 URL's ``X-Amz-Signature``, ``X-Amz-Security-Token`` and ``X-Amz-Credential``,
a ``?password=``. The rest of a SAS (``sv``, ``se``, ``sp``...) says what it grants."""

_QUERY_PARAM = re.compile(r"([?&])([^=&#]+)=([^&#]*)")


def _secret_query_name(name: str) -> bool:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1.\2", unquote(name))
    parts = [part for part in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if part]
    return any(part in SECRET_QUERY_WORDS or part.removesuffix("s") in SECRET_QUERY_WORDS
               for part in parts)  # fmt: skip


def query_secrets(uri: str) -> list[str]:
    """The values of ``uri``'s secret query parameters (:data:`SECRET_QUERY_WORDS`), as
    written, in order; ``[]`` for a text without a ``scheme://`` or a query."""
    if "://" not in uri or "?" not in uri:
        return []
    query = uri.split("?", 1)[1].split("#", 1)[0]
    return [
        value
        for _, name, value in _QUERY_PARAM.findall("?" + query)
        if value and _secret_query_name(name)
    ]


def shown_location(location: str) -> str:
    """``location`` as fanout prints or records it (status, messages, commands, ``--json``):
    the password of a URI's ``user:password@`` (to the authority's last ``@``:
    :func:`written_passwords`) and the value of its secret query parameters
    (:func:`query_secrets`: ``?sig=``) replaced by ``***`` (``s3://KEY:***@bucket/ckpt``,
    ``abfss://c@acct.dfs.core.windows.net/t?sv=2022&sig=***``), anything else as written.
    The user part stays: it names an account or a container
    (``abfss://container@account...``), not a secret."""
    shown = location
    span = _password_end(location.strip())
    if written_password(location) is not None and span is not None:
        shown = f"{location.strip()[: span[0]]}***{location.strip()[span[1] :]}"
    if not query_secrets(shown):
        return shown
    path, _, query = shown.partition("?")
    query, hash_, fragment = query.partition("#")
    masked = _QUERY_PARAM.sub(
        lambda m: f"{m[1]}{m[2]}={'***' if m[3] and _secret_query_name(m[2]) else m[3]}",
        "?" + query,
    )
    return f"{path}{masked}{hash_}{fragment}"


def same_table_key(location: str) -> str:
    """What two locations naming one table have in common: a local path (plain or
    ``file:``, read as :func:`local_path` reads it) absolute, normalised and with its
    symbolic links followed (``/data/lake/t`` and ``/lake/t`` through a link ``/lake`` to
    ``/data/lake`` are one table), any other URI as written less a trailing ``/``."""
    path = local_path(location)
    if path is None:
        return location.rstrip("/")
    return os.path.realpath(path)
