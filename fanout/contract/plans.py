"""How messages show a batch's plan: its source offsets and Spark's planning time
(``batchTimestampMs``). Shared by the checkpoint guard, the spool's refusals and sinks'
own plan checks (the Delta sink's recorded plans)."""

from __future__ import annotations

import json
from datetime import UTC, datetime


def planned_at(timestamp_ms: int) -> str:
    """A planning time as the messages show it: milliseconds (as in ``offsets/N``) and UTC."""
    moment = datetime.fromtimestamp(timestamp_ms / 1000, UTC)
    return f"{timestamp_ms} ({moment:%Y-%m-%dT%H:%M:%S}.{timestamp_ms % 1000:03d}Z)"


def describe_plan(source_offsets: object, timestamp_ms: int | None, *, recorded: bool) -> str:
    """``source offsets <json>[, planned at <time>]``; ``recorded`` tells whether missing
    offsets were "not recorded" (a ledger row) or are "unknown" (the batch at hand)."""
    if source_offsets is None:
        text = "source offsets " + ("not recorded" if recorded else "unknown")
    else:
        text = f"source offsets {json.dumps(source_offsets)}"
    return text if timestamp_ms is None else f"{text}, planned at {planned_at(timestamp_ms)}"
