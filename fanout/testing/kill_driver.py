"""``python -m fanout.testing.kill_driver SPEC``: write one batch through ``FanOut`` and die
by SIGKILL right after the sink's write, before its ledger mark (the conformance suite's
kill check). ``SPEC`` is JSON: pipeline, ledger path, the sink's configuration, the rows."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from fanout import hookimpl
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult
from fanout.fan_out import FanOut
from fanout.spark import local_session


class KillAfterWrite:
    """Kills this process in ``fanout_sink_done``: after the write, before the mark."""

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """SIGKILL, at once: no ledger mark, no cleanup."""
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    """Run the spec; never returns normally."""
    spec: dict[str, Any] = json.loads(argv[0])
    spark = local_session("fanout-conformance-kill")
    fan = FanOut(spec["pipeline"], spec["ledger"], [spec["sink"]], plugins=[KillAfterWrite()])
    batch = spark.createDataFrame([tuple(r) for r in spec["rows"]], "id BIGINT, v STRING")
    fan.process(batch, BatchInfo(spec["pipeline"], 0, "conformance-query"))
    raise SystemExit("the driver was not killed")


if __name__ == "__main__":
    main(sys.argv[1:])
