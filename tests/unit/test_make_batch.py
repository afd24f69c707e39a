"""fanout.testing.make_batch: a batch for a sink's unit tests, in epoch 0 or a later one."""

from __future__ import annotations

from fanout.testing import make_batch


def test_a_batch_of_epoch_0_is_keyed_by_pipeline_sink_and_batch_id() -> None:
    batch = make_batch([{"id": 1}], batch_id=3, pipeline="orders", sink_name="lite")
    key = batch.idempotency_key
    assert (key.app_id, key.version, key.token) == (
        "fanout/orders/lite",
        3,
        "orders~lite~000000000003",
    )
    assert batch.info.epoch == 0 and batch.arrow().to_pylist() == [{"id": 1}]


def test_a_batch_of_a_later_epoch_has_a_new_key() -> None:
    """A sink's unit test can check that a new epoch's batch 0 is not taken for the old."""
    batch = make_batch([{"id": 1}], pipeline="orders", sink_name="lite", epoch=2)
    key = batch.idempotency_key
    assert (key.app_id, key.version, key.token) == (
        "fanout/orders@e2/lite",
        0,
        "orders@e2~lite~000000000000",
    )
    assert batch.info.epoch == 2
