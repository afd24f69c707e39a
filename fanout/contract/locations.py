"""Which local path a location names: a plain path, or a ``file:`` URL, read as delta-rs
reads a table's location.

Hadoop (and so Spark's resolved checkpoint paths) writes ``file:/x y`` unescaped: a
``%20`` there is part of a name. Such a location is not for this function.
"""

from __future__ import annotations

import os
import shlex
from urllib.parse import unquote, urlsplit


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


def command_location(location: str) -> str:
    """How a command fanout prints (``fanout ledger skip --ledger ...``) names ``location``,
    so that it runs from any directory: a plain local path made absolute (from the current
    directory, where fanout opens it), a URI of any scheme (``file:`` included) as written,
    less the password of a ``user:password@`` in it (printed commands never carry a secret);
    quoted for a POSIX shell where it needs to be (``'/data/my lake'``). A location that is
    not a path at all (an in-memory ledger's name) is not for this function."""
    if location.startswith("file:") or "://" in location:
        return shlex.quote(_without_password(location))
    return shlex.quote(os.path.abspath(location))


def _without_password(uri: str) -> str:
    """``uri`` with the password of its ``user:password@`` replaced by ``***``."""
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:
        return uri
    if not password:
        return uri
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return parts._replace(netloc=f"{name}:***@{host}").geturl()
