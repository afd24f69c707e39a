"""A real third-party plugin distribution, installed, found through its entry point.

``tests/plugins/fanout-sample`` is an ordinary distribution (``fanout-sample``) providing
the ``sample-jsonl`` sink type. The fixture installs it editable into the running
interpreter when it is missing; the tests then use the real ``load_registry()`` and a real
``FanOut``, with no fakes but the DataFrame and the in-memory ledger.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import tomllib
from pathlib import Path

import pyarrow as pa

from fanout import BatchInfo, FanOut, SinkResult
from fanout.hooks.registry import load_registry
from fanout.ledger.memory import MemoryLedger
from tests.unit.fakes import FakeFrame

SAMPLE = Path(__file__).resolve().parents[1]


def test_sample_sink_type_comes_from_its_distribution(
    sample_distribution: importlib.metadata.Distribution,
) -> None:
    version = tomllib.loads((SAMPLE / "pyproject.toml").read_text())["project"]["version"]
    assert sample_distribution.version == version

    registry = load_registry()  # the installed entry points, nothing faked
    assert [str(e) for e in registry.load_errors] == []
    sink_type = registry.sink_types()["sample-jsonl"]

    from fanout_sample.plugin import JsonLinesSink

    assert sink_type.sink_class is JsonLinesSink
    assert sink_type.guarantees == ("idempotent",)
    assert (sink_type.plugin.name, sink_type.plugin.module) == ("sample", "fanout_sample.plugin")
    assert (sink_type.plugin.distribution, sink_type.plugin.version) == ("fanout-sample", version)
    assert sink_type.plugin.describe() == f"fanout-sample {version}"


def test_sample_sink_end_to_end_through_fanout(
    sample_distribution: importlib.metadata.Distribution, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    ledger = MemoryLedger()
    frame = FakeFrame(pa.table({"id": [1, 2], "name": ["a", "ü"], "amount": [1.5, None]}))
    spec = {"type": "sample-jsonl", "name": "files", "directory": str(out)}

    with FanOut("sample", ledger, [spec], backoff_s=0) as fan:
        assert out.is_dir()  # open() created it, before any batch
        results = fan.process(frame, BatchInfo("sample", 7, "q-1", [{"topic": {"0": 42}}]))

    target = out / "sample~files~000000000007.jsonl"
    assert results == {"files": SinkResult(rows=2, details={"path": str(target)})}
    assert target.read_text(encoding="utf-8") == (
        '{"id": 1, "name": "a", "amount": 1.5}\n{"id": 2, "name": "\\u00fc", "amount": null}\n'
    )
    assert [json.loads(line) for line in target.read_text().splitlines()] == [
        {"id": 1, "name": "a", "amount": 1.5},
        {"id": 2, "name": "ü", "amount": None},
    ]
    assert ledger.last_committed("sample", ["files"]) == {"files": 7}
    assert [(e.sink, e.batch_id, e.status, e.rows) for e in ledger.entries] == [
        ("*", 7, "epoch", None),  # the query claims the pipeline's first epoch
        ("files", 7, "committed", 2),
    ]
    assert frame.to_arrow_calls == 1
    assert frame.persist_calls == 0

    # a replay after a crash before the mark (fresh ledger): same file, nothing else left
    fan2 = FanOut("sample", MemoryLedger(), [spec], backoff_s=0)
    fan2.process(frame, BatchInfo("sample", 7, "q-1"))
    fan2.process(
        FakeFrame(pa.table({"id": [3], "name": ["c"], "amount": [0.0]})),
        BatchInfo("sample", 8, "q-1"),
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "sample~files~000000000007.jsonl",
        "sample~files~000000000008.jsonl",
    ]
    assert target.read_text(encoding="utf-8").count("\n") == 2
    assert (
        out / "sample~files~000000000008.jsonl"
    ).read_text() == '{"id": 3, "name": "c", "amount": 0.0}\n'


def test_idempotency_key_is_the_txn_id_and_batch_and_new_per_epoch() -> None:
    from fanout import Batch, BatchInfo, IdempotencyKey
    from fanout.contract.batch import txn_app_id

    def key(pipeline: str, sink: str, epoch: int, batch_id: int) -> IdempotencyKey:
        info = BatchInfo(pipeline, batch_id, epoch=epoch)
        return Batch(None, info, sink, txn_app_id(pipeline, sink, epoch)).idempotency_key

    assert key("orders", "raw", 0, 7) == IdempotencyKey("fanout/orders/raw", 7)
    assert key("orders", "raw", 0, 7).token == "orders~raw~000000000007"
    assert key("orders", "raw", 2, 7).token == "orders@e2~raw~000000000007"
    assert str(key("orders", "raw", 1, 7)) == "fanout/orders@e1/raw@7"
    assert key("orders", "raw", 0, 7).derived("dead_letter") == IdempotencyKey(
        "fanout/orders/raw/dead_letter", 7
    )
    # dotted names that collide when joined with dots stay apart
    assert key("orders.eu", "kafka", 0, 1).token != key("orders", "eu.kafka", 0, 1).token
