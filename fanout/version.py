"""The installed version of fanout, recorded in every ledger row."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fanout")
except PackageNotFoundError:  # running from a source tree or a --py-files zip
    __version__ = "0+unknown"
