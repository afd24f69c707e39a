"""A Delta sink's object-store credentials are known secrets, and its target's repr
leaves them out."""

from __future__ import annotations

from fanout_delta import DeltaSink
from fanout_delta.target import DeltaTarget

OPTIONS = {
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE1",
    "AWS_SECRET_ACCESS_KEY": "TopSecretAwsKey123",
    "azure_storage_sas_token": "sv=2024&sig=abc",
    "AWS_REGION": "us-east-1",
    "conditional_put": "etag",
}


def test_storage_credentials_are_secret_values() -> None:
    sink = DeltaSink(name="d", path="s3://bucket/t", storage_options=OPTIONS)
    assert list(sink.secret_values()) == ["AKIAEXAMPLE1", "TopSecretAwsKey123", "sv=2024&sig=abc"]
    assert list(DeltaSink(name="d", path="/t").secret_values()) == []


def test_the_target_repr_leaves_the_storage_options_out() -> None:
    shown = repr(DeltaTarget("d", "s3://bucket/t", "append", storage_options=OPTIONS))
    assert shown.startswith("DeltaTarget(name='d', path='s3://bucket/t', mode='append'")
    assert "TopSecretAwsKey123" not in shown and "storage_options" not in shown


def test_a_password_in_the_table_or_dead_letter_location_is_a_secret_value() -> None:
    """A table at ``s3://KEY:SECRET@bucket/t``: its password was no secret value, so a
    failed write's error named it in the log and the ledger."""
    sink = DeltaSink(
        name="d", path="s3://KEY:TablePassw0rd%21@bucket/t",
        dead_letter="abfss://user:Dlq-Passw0rd@acct.dfs.core.windows.net/dlq",
    )  # fmt: skip
    assert list(sink.secret_values()) == ["TablePassw0rd%21", "TablePassw0rd!", "Dlq-Passw0rd"]
