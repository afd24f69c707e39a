"""A sink on the default ``transactional_id_prefix`` initialises the former default's ids
(``fanout-<pipeline>-<sink>-<p>``) at its first batch (:func:`fanout_kafka.abandoned.
fence_legacy_transactions`). A principal granted only the prefix in use, as ``fanout
validate``'s refusal tells, is refused those ids: every run's first batch failed on it.
Tansu has no ACLs, so the brokers' refusal is stood in."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from fanout_kafka import abandoned

from fanout.errors import TransientSinkError

SETTINGS: Any = type("Settings", (), {"sink": "events"})()


def _refusing(code: int) -> Any:
    def end(settings: Any, partitions: int, batch_id: int, **kw: Any) -> None:
        cause = KafkaException(KafkaError(code, "refused"))
        raise TransientSinkError("cannot end", sink="events", batch_id=batch_id) from cause

    return end


def test_former_ids_the_principal_may_not_use_are_warned_not_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(abandoned, "replace", lambda settings, **kw: settings)
    refused = _refusing(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    monkeypatch.setattr(abandoned, "end_abandoned_transactions", refused)
    with caplog.at_level(logging.WARNING, "fanout_kafka"):
        abandoned.fence_legacy_transactions(SETTINGS, "fanout-p-events", 4, 0)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "sink 'events': the brokers do not let its principal use the former transactional "
        "ids fanout-p-events-<p>"
    ]
    monkeypatch.setattr(abandoned, "end_abandoned_transactions", _refusing(KafkaError._TRANSPORT))
    with pytest.raises(TransientSinkError, match="cannot end"):
        abandoned.fence_legacy_transactions(SETTINGS, "fanout-p-events", 4, 0)
