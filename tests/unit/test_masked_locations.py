"""The ledger's and the spool's own errors name their location with its password masked,
in fanout's words and in the store's (before, only ``open_fanout_table``'s did: the rest
reached any Python caller with the raw ``user:password@``, hidden only by the CLI's
masking stream)."""

from __future__ import annotations

import pytest

from fanout.contract.batch import BatchInfo
from fanout.errors import ConfigurationError, SpoolError
from fanout.ledger.delta import DeltaLedger
from fanout.spool.index import existing_index
from fanout.spool.refusals import spool_reset_message, spool_rollback_message
from fanout.spool.table import Spool

SECRET = "LongSecretPassw0rd"


def test_a_ledger_refused_for_unsafe_commits_names_its_location_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    ledger = DeltaLedger(f"s3://KEY:{SECRET}@bucket/ledger")
    for call in (ledger.exists, ledger.check, ledger.open):
        with pytest.raises(ConfigurationError) as refused:
            call()
        assert str(refused.value).startswith(
            "ledger at s3://KEY:***@bucket/ledger: the environment variable "
            "AWS_S3_ALLOW_UNSAFE_RENAME=true lets delta-rs commit without an exclusive write"
        ), str(refused.value)
        assert SECRET not in str(refused.value)


def test_a_spool_whose_index_cannot_be_opened_names_its_location_masked_on_one_line() -> None:
    spool = Spool(f"az://user:{SECRET}@x/spool", "p")
    with pytest.raises(SpoolError) as refused:
        spool.open()
    text = str(refused.value)
    assert text.startswith("spool at az://user:***@x/spool: cannot open its index: "), text
    assert text.endswith(" -> az://user:***@x/spool/index"), text
    assert SECRET not in text and "\n" not in text and "\x1b" not in text


def test_no_spool_at_a_location_names_it_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    import fanout.spool.index as spool_index

    monkeypatch.setattr(spool_index, "open_index", lambda path, options=None: None)
    with pytest.raises(ConfigurationError) as refused:
        existing_index(f"s3://KEY:{SECRET}@bucket/spool", "p")
    assert str(refused.value).startswith(
        "--spool s3://KEY:***@bucket/spool: no spool there (no s3://KEY:***@bucket/spool/index "
        "table, which a pipeline run with a spool creates when it starts)"
    ), str(refused.value)


def test_the_spool_refusals_name_the_spool_and_the_ledger_masked() -> None:
    info = BatchInfo("p", 3, "q-new", batch_timestamp_ms=2000)
    spooled = BatchInfo("p", 3, "q-old", batch_timestamp_ms=1000)
    path, ledger = f"s3://KEY:{SECRET}@bucket/spool", f"s3://KEY:{SECRET}@bucket/ledger"
    reset = spool_reset_message(info, spooled, ["a"], path, ledger)
    assert "but the spool at s3://KEY:***@bucket/spool holds batch" in reset, reset
    assert "`fanout status --ledger s3://KEY:***@bucket/ledger --pipeline p --spool" in reset
    rolled = spool_rollback_message(
        BatchInfo("p", 3, "q-old", batch_timestamp_ms=2000), spooled, ["a"], path
    )
    assert "spool at s3://KEY:***@bucket/spool holds batch" in rolled, rolled
    assert SECRET not in reset and SECRET not in rolled
