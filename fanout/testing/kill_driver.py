"""``python -m fanout.testing.kill_driver SPEC``: write one batch through ``FanOut`` and die
(:class:`fanout.testing.faults.KillAt`) right after the sink's write, before its ledger
mark: the conformance suite's kill check. ``SPEC`` is JSON: pipeline, ledger path, the
sink's configuration, the rows, and optionally ``plugins``: names of modules registering the
sink type when it is not installed, and ``paths``: the directories they were imported from."""

from __future__ import annotations

import importlib
import json
import os
import site
import sys
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.fan_out import FanOut
from fanout.spark import local_session
from fanout.testing.faults import KillAt


def main(argv: list[str]) -> None:
    """Run the spec; never returns normally."""
    spec: dict[str, Any] = json.loads(argv[0])
    spark = local_session("fanout-conformance-kill")
    killer = KillAt("sink_done", 0, sink=spec["sink"]["name"])
    _add_paths(spec.get("paths", ()))
    modules = [importlib.import_module(name) for name in spec.get("plugins", ())]
    fan = FanOut(spec["pipeline"], spec["ledger"], [spec["sink"]], plugins=[killer, *modules])
    batch = spark.createDataFrame([tuple(r) for r in spec["rows"]], "id BIGINT, v STRING")
    fan.process(batch, BatchInfo(spec["pipeline"], 0, "conformance-query"))
    raise SystemExit("the driver was not killed")


def _add_paths(paths: list[str]) -> None:
    """Put ``paths`` on ``sys.path`` ahead of site-packages, so that the plugin module the
    test imported wins over an installed copy of it, but behind the standard library, which
    a test folder's ``json.py`` must not shadow (as it would from ``PYTHONPATH``)."""
    sites = {os.path.realpath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    at = next((i for i, p in enumerate(sys.path) if os.path.realpath(p) in sites), len(sys.path))
    sys.path[at:at] = [p for p in dict.fromkeys(paths) if p not in sys.path]


if __name__ == "__main__":
    main(sys.argv[1:])
