"""Names a package exports but imports only when first asked for (PEP 562).

A plugin package's entry point imports the package; its sink module pulls in the driver
libraries (pandas, confluent_kafka, deltalake). Exporting the sink class through
:func:`lazy_names` keeps ``from fanout_postgres import PostgresSink`` working while a
command that uses no such sink never imports them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` for ``package``: each of ``names`` (an exported name
    to the module defining it) is imported from its module the first time it is asked for,
    then kept in ``namespace`` (the package's ``globals()``); any other name is an
    :class:`AttributeError`, as without it."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        namespace[name] = value
        return value

    return __getattr__
