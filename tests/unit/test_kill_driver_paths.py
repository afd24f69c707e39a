"""Where the conformance kill check's driver puts the directories its plugin modules were
imported from: behind the standard library (a test folder's ``json.py`` must not shadow
it), ahead of site-packages (an older installed copy of the plugin must not win)."""

from __future__ import annotations

import site
import sys

import pytest

from fanout.testing.kill_driver import _add_paths

SITE = "/venv/lib/python3.11/site-packages"


def test_plugin_roots_go_between_the_stdlib_and_site_packages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "path", ["", "/wt", "/py/lib/python3.11", SITE, "/editable"])
    monkeypatch.setattr(site, "getsitepackages", lambda: [SITE])
    monkeypatch.setattr(site, "getusersitepackages", lambda: "/home/u/site")
    _add_paths(["/tests/src", "/wt", "/tests/src", "/other"])
    assert sys.path == [
        "", "/wt", "/py/lib/python3.11", "/tests/src", "/other", SITE, "/editable"
    ]  # fmt: skip


def test_without_site_packages_on_the_path_the_roots_go_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "path", ["", "/py/lib/python3.11"])
    monkeypatch.setattr(site, "getsitepackages", lambda: [SITE])
    monkeypatch.setattr(site, "getusersitepackages", lambda: "/home/u/site")
    _add_paths(["/tests/src"])
    assert sys.path == ["", "/py/lib/python3.11", "/tests/src"]
