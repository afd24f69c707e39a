"""``init_transactions`` without librdkafka's 500 ms stall.

A new transactional producer asks for its transaction coordinator at once. When no broker
connection is up yet at that instant, librdkafka waits for a broker to come up and asks
again; when the connection comes up while it is deciding that, it asks again only when its
coordinator timer fires, 500 ms later (librdkafka 2.16, ``debug=eos``: "Unable to query
for transaction coordinator ... No brokers available", then "Querying for transaction
coordinator: Coordinator query timer" 500 ms on). A partition's task waited that long in
~1 of 30-40 partitions of ``bench/bench_three_sinks.py``, and in 34 of 100 producers that
read metadata before initialising on a loaded machine. A timed-out ``init_transactions``
may be called again (librdkafka resumes it), and each call starts the PID request again:
so it is called in slices of :data:`SLICE_S` until the caller's timeout. Measured the same
way: 0 of 100 waited over 400 ms.
"""

from __future__ import annotations

import time
from typing import Any

SLICE_S = 0.1
"""How long one ``init_transactions`` call may wait before it is called again."""


def init_transactions(producer: Any, timeout_s: float) -> None:
    """``producer.init_transactions`` within ``timeout_s``, called again every
    :data:`SLICE_S` while it times out; other errors, and the timeout at the end, raise as
    librdkafka raises them."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            producer.init_transactions(max(min(SLICE_S, left), 0.001))
            return
        except KafkaException as exc:
            timed_out = exc.args[0].code() == KafkaError._TIMED_OUT
            if not timed_out or time.monotonic() >= deadline:
                raise
