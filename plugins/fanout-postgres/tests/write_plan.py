"""The write plan a test's writer runs, as the sink's hooks get it on the driver."""

from __future__ import annotations

from typing import Any

from fanout_postgres import PostgresSink
from fanout_postgres.plan import WritePlan


def write_plan(sink: PostgresSink, spark_schema: Any, batch_id: int | None) -> WritePlan:
    """``sink``'s plan of batches of ``spark_schema`` at batch ``batch_id`` (``None``: at
    ``open()``): :meth:`fanout_postgres.write_plans.WritePlans.plan`, cached, checked, the
    table created at the first batch when ``create_table`` is on."""
    return sink._write_plans.plan(sink._planning(), spark_schema, batch_id)
