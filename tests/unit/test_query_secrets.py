"""A location's secret query parameters (an Azure SAS's ``?sig=``, a presigned URL's
``X-Amz-Signature``) are secrets as a ``user:password@`` is: before, neither
:func:`fanout.contract.locations.shown_location` nor
:func:`fanout.observe.secrets.location_secrets` read a query, so ``fanout status`` and
any Python caller printed a ledger's SAS signature whole (in fanout's words, and in the
``--ledger`` of every command it prints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.app.cli import main
from fanout.contract.locations import shown_location
from fanout.errors import LedgerError
from fanout.ledger.delta import DeltaLedger
from fanout.observe.logs import secrets_apart
from fanout.observe.secrets import location_secrets

SIG = "SasSig0123456789xyz"


def test_shown_location_masks_the_secret_query_values_only() -> None:
    assert shown_location(f"abfss://c@acct.dfs.core.windows.net/t?sv=2022&sp=rw&sig={SIG}") == (
        "abfss://c@acct.dfs.core.windows.net/t?sv=2022&sp=rw&sig=***"
    )
    assert shown_location("s3://K:pw@b/x?X-Amz-Signature=abc&X-Amz-Date=1#f") == (
        "s3://K:***@b/x?X-Amz-Signature=***&X-Amz-Date=1#f"
    )
    assert shown_location("s3://b/x?versionId=3") == "s3://b/x?versionId=3"
    assert shown_location("/data/x?sig=1") == "/data/x?sig=1"  # a path: no query


def test_location_secrets_reads_secret_query_values_as_written_and_decoded() -> None:
    assert location_secrets([f"az://c/t?sv=1&sig={SIG}%2Bz", "s3://b/x?X-Amz-Date=1"]) == [
        f"{SIG}%2Bz",
        f"{SIG}+z",
    ]


def test_a_ledger_s_sas_signature_is_masked_in_its_errors_and_the_cli(
    tmp_path: Path, capsys: Any
) -> None:
    ledger = f"file://{tmp_path}/ledger?sv=2022&sig={SIG}"
    with pytest.raises(LedgerError) as refused:
        DeltaLedger(ledger).rows()
    assert str(refused.value) == (
        f"no ledger at file://{tmp_path}/ledger?sv=2022&sig=***: a FanOut creates it when it "
        "starts; check the path"
    )
    with secrets_apart():  # what the command registers only
        code = main(["status", "--ledger", ledger, "--pipeline", "p"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")  # refused as a location with no ledger, named local
    assert err.startswith(f"fanout: configuration error: no ledger at {tmp_path}/ledger: ")
    assert SIG not in err


def test_a_password_with_an_unescaped_at_sign_is_read_to_the_authority_s_last_at() -> None:
    """``s3://KEY:p@ss@bucket``: SQLAlchemy's reading ends the password at the first ``@``;
    a location's is masked to the last one before the path, and each part is a secret."""
    location = "s3://KEY:Secr@t-Passw0rd-77@bucket/x@y?q=1@2"
    assert shown_location(location) == "s3://KEY:***@bucket/x@y?q=1@2"
    assert location_secrets(location) == ["Secr", "Secr@t-Passw0rd-77", "t-Passw0rd-77"]
    assert location_secrets("s3://KEY@bucket/x@y") == []
