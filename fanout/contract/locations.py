"""Which local path a location names: a plain path, or a ``file:`` URL, read as delta-rs
reads a table's location.

Hadoop (and so Spark's resolved checkpoint paths) writes ``file:/x y`` unescaped: a
``%20`` there is part of a name. Such a location is not for this function.
"""

from __future__ import annotations

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
