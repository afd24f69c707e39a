"""A plugin sink as a third party may write it, for
``tests/integration/test_dead_letter_moved.py``: it hands its refused rows to the target
with ``context.dead_letters.write(...)`` itself, not through
:func:`fanout.deadletters.moved.write_letters` as the contract asks.

Type ``direct_letters``: one JSON file per batch, named by the batch's idempotency token
and renamed into place whole (its commit), holding the rows it took and those it refused
(status ``shipped``). The refused rows go to the dead-letter target after that commit, from
what it recorded, and again when a replay finds the batch's file (the target keeps a
batch's letters once)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fanout import Batch, Sink, SinkContext, SinkResult, SinkWriteError, hookimpl
from fanout.contract.dead_letters import DeadLetter, DeadLetterTarget
from fanout.contract.sink import Reads

REFUSED = "shipped"


class DirectLettersFiles(Sink):
    """One file per batch; rows of status ``shipped`` refused, handed to
    ``context.dead_letters.write``."""

    guarantees = ("idempotent",)

    def __init__(self, name: str, *, directory: str, dead_letter: str | None = None) -> None:
        super().__init__(name)
        self.directory = directory
        self.dead_letter = dead_letter  # fanout resolves it into context.dead_letters
        self._letters: DeadLetterTarget | None = None

    @property
    def reads(self) -> Reads:
        return "arrow"

    def open(self, context: SinkContext) -> None:
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        self._letters = context.dead_letters

    def write(self, batch: Batch) -> SinkResult:
        final = Path(self.directory) / f"{batch.idempotency_key.token}.json"
        if final.exists():  # committed by an attempt whose mark was lost
            done = json.loads(final.read_text())
            self._hand_over(batch, done["refused"])
            return SinkResult(
                len(done["rows"]), dead_lettered=len(done["refused"]), already_written=True
            )
        rows: list[dict[str, Any]] = batch.arrow().to_pylist()
        taken = [r for r in rows if r["status"] != REFUSED]
        refused = [r for r in rows if r["status"] == REFUSED]
        if refused and self._letters is None:
            raise SinkWriteError(
                f"sink {self.name!r}, batch {batch.batch_id}: {len(refused)} row(s) of status "
                f"{REFUSED!r} refused; give the sink a 'dead_letter' target",
                sink=self.name, batch_id=batch.batch_id,
            )  # fmt: skip
        tmp = final.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rows": taken, "refused": refused}))
        os.replace(tmp, final)
        self._hand_over(batch, refused)
        return SinkResult(len(taken), dead_lettered=len(refused))

    def _hand_over(self, batch: Batch, refused: list[dict[str, Any]]) -> None:
        if refused and self._letters is not None:
            letters = [DeadLetter(row, f"status {REFUSED!r}", "status", REFUSED) for row in refused]
            self._letters.write(batch, letters, source="refused")  # the target's own write


@hookimpl
def fanout_sink_types() -> Mapping[str, type[Sink]]:
    """The sink type of this plugin."""
    return {"direct_letters": DirectLettersFiles}
