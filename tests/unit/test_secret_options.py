"""Which options hold secrets: checked against the real option names of object_store (the
storage options delta-rs passes on) and of delta-rs itself."""

from __future__ import annotations

from fanout.observe.secrets import secret_option_values, url_password

# object_store (apache/arrow-rs-object-store, main in 2026): the names AmazonS3ConfigKey,
# AzureConfigKey, GoogleConfigKey and ClientConfigKey parse, aliases included.
AWS = """access_key_id aws_access_key_id aws_allow_http aws_bucket aws_bucket_name
aws_checksum_algorithm aws_conditional_put aws_container_authorization_token_file
aws_container_credentials_full_uri aws_container_credentials_relative_uri aws_copy_if_not_exists
aws_default_region aws_disable_bulk_delete aws_disable_tagging aws_endpoint aws_endpoint_url
aws_endpoint_url_s3 aws_endpoint_url_sts aws_imdsv1_fallback aws_metadata_endpoint aws_region
aws_request_payer aws_role_arn aws_role_session_name aws_s3_express aws_secret_access_key
aws_server_side_encryption aws_session_token aws_skip_signature aws_sse_bucket_key_enabled
aws_sse_customer_key_base64 aws_sse_kms_key_id aws_token aws_unsigned_payload
aws_virtual_hosted_style_request aws_web_identity_token_file bucket bucket_name
checksum_algorithm conditional_put container_authorization_token_file
container_credentials_full_uri container_credentials_relative_uri copy_if_not_exists
default_region disable_bulk_delete disable_tagging endpoint endpoint_url endpoint_url_sts
imdsv1_fallback metadata_endpoint region request_payer role_arn role_session_name s3_express
secret_access_key server_side_encryption session_token skip_signature sse_bucket_key_enabled
sse_customer_key_base64 sse_kms_key_id token unsigned_payload virtual_hosted_style_request
web_identity_token_file"""
AZURE = """access_key account_key account_name authority_host authority_id azure_allow_http
azure_authority_host azure_authority_id azure_client_id azure_client_secret azure_container_name
azure_credential_type azure_disable_tagging azure_endpoint azure_fabric_cluster_identifier
azure_fabric_session_token azure_fabric_token_service_url azure_fabric_workload_host
azure_federated_token_file azure_identity_endpoint azure_msi_endpoint azure_msi_resource_id
azure_object_id azure_skip_signature azure_storage_access_key azure_storage_account_key
azure_storage_account_name azure_storage_authority_host azure_storage_authority_id
azure_storage_client_id azure_storage_client_secret azure_storage_encryption_key
azure_storage_endpoint azure_storage_master_key azure_storage_sas_key azure_storage_sas_token
azure_storage_tenant_id azure_storage_token azure_storage_use_emulator azure_tenant_id
azure_use_azure_cli azure_use_fabric_endpoint bearer_token client_id client_secret
container_name credential_type encryption_key fabric_cluster_identifier fabric_session_token
fabric_token_service_url fabric_workload_host federated_token_file identity_endpoint
master_key msi_endpoint msi_resource_id object_id sas_key sas_token tenant_id use_azure_cli
use_emulator use_fabric_endpoint"""
GOOGLE = """application_credentials base_url google_application_credentials google_base_url
google_bearer_token google_bucket google_bucket_name google_service_account
google_service_account_key google_service_account_path google_skip_signature service_account
service_account_key service_account_path"""
CLIENT = """allow_http allow_invalid_certificates connect_timeout default_content_type
disable_system_certificates http1_only http2_keep_alive_interval http2_keep_alive_timeout
http2_keep_alive_while_idle http2_max_frame_size http2_only pool_idle_timeout
pool_max_idle_per_host proxy_ca_certificate proxy_excludes proxy_url randomize_addresses
read_timeout timeout user_agent"""
# delta-rs crates/aws/src/constants.rs
DELTA_RS = """AWS_ENDPOINT_URL AWS_ENDPOINT_URL_DYNAMODB AWS_REGION_DYNAMODB
AWS_ACCESS_KEY_ID_DYNAMODB AWS_SECRET_ACCESS_KEY_DYNAMODB AWS_SESSION_TOKEN_DYNAMODB AWS_PROFILE
AWS_S3_ADDRESSING_STYLE AWS_S3_LOCKING_PROVIDER AWS_IAM_ROLE_ARN AWS_S3_ASSUME_ROLE_ARN
AWS_IAM_ROLE_SESSION_NAME AWS_S3_ROLE_SESSION_NAME AWS_S3_POOL_IDLE_TIMEOUT_SECONDS
AWS_STS_POOL_IDLE_TIMEOUT_SECONDS AWS_S3_GET_INTERNAL_SERVER_ERROR_RETRIES AWS_ROLE_ARN
AWS_ROLE_SESSION_NAME AWS_ALLOW_HTTP AWS_S3_ALLOW_UNSAFE_RENAME AWS_EC2_METADATA_DISABLED
AWS_EC2_METADATA_TIMEOUT AWS_FORCE_CREDENTIAL_LOAD DELTA_DYNAMO_TABLE_NAME
DELTA_DYNAMO_BILLING_MODE DELTA_DYNAMO_MAX_ELAPSED_REQUEST_TIME"""

SECRETS = """access_key_id aws_access_key_id aws_secret_access_key aws_session_token
aws_sse_customer_key_base64 aws_token secret_access_key session_token sse_customer_key_base64
token access_key account_key azure_client_secret azure_fabric_session_token
azure_storage_access_key azure_storage_account_key azure_storage_client_secret
azure_storage_encryption_key azure_storage_master_key azure_storage_sas_key
azure_storage_sas_token azure_storage_token bearer_token client_secret encryption_key
fabric_session_token master_key sas_key sas_token google_bearer_token google_service_account_key
service_account_key AWS_ACCESS_KEY_ID_DYNAMODB AWS_SECRET_ACCESS_KEY_DYNAMODB
AWS_SESSION_TOKEN_DYNAMODB"""
"""Keys, secrets, tokens and the access key ids that go with them."""

READABLE_WITH_A_SECRET_WORD = """aws_container_authorization_token_file
aws_container_credentials_full_uri aws_container_credentials_relative_uri
aws_sse_bucket_key_enabled aws_sse_kms_key_id aws_web_identity_token_file
container_authorization_token_file container_credentials_full_uri
container_credentials_relative_uri sse_bucket_key_enabled sse_kms_key_id web_identity_token_file
azure_credential_type azure_fabric_token_service_url azure_federated_token_file credential_type
fabric_token_service_url federated_token_file application_credentials
google_application_credentials AWS_FORCE_CREDENTIAL_LOAD"""
"""Paths, URLs, flags and ids: each value (e.g. ``true``) was masked in every text before."""


def test_the_secret_storage_options_are_the_credentials_only() -> None:
    names = " ".join([AWS, AZURE, GOOGLE, CLIENT, DELTA_RS]).split()
    found = secret_option_values({name: f"value-of-{name}" for name in names})
    assert found == [f"value-of-{name}" for name in names if name in SECRETS.split()]
    readable = READABLE_WITH_A_SECRET_WORD.split()
    assert secret_option_values({name: "true" for name in readable}) == []


def test_option_words_match_whole_parts_of_the_name() -> None:
    options = {
        "sasl.mechanism": "PLAIN",  # "sas" is not "sasl"
        "keytab": "/etc/krb5.keytab",
        "clientSecret": "cs-1",  # camelCase parts
        "X-Api-Key": "ak-2",
        "storage_credentials": "cred-3",  # a plural counts
    }
    assert secret_option_values(options) == ["cs-1", "ak-2", "cred-3"]


def test_a_password_inside_a_url_option_is_a_secret() -> None:
    options = {
        "proxy_url": "http://proxy-user:pr%40xy@proxy:3128",
        "aws_endpoint": "http://minio:9000",
        "azure_fabric_token_service_url": "https://svc:t0k3n@fabric.example/token",
        "aws_region": "us-east-1",
    }
    assert secret_option_values(options) == ["pr%40xy", "pr@xy", "t0k3n"]
    assert url_password("no url: user:pw@host") == []
    assert url_password("https://only-user@host") == []


def test_a_password_holding_a_slash_question_mark_or_hash_is_found_whole() -> None:
    """SQLAlchemy and libpq read a URL's password up to the first ``@``, so an unescaped
    ``/``, ``?`` or ``#`` is part of it; urllib's ``urlsplit`` ends the authority there and
    would give only the first piece, leaving the rest in every message."""
    assert url_password("http://u:pa/ss?w#rd@proxy:3128/x") == ["pa/ss?w#rd"]
    assert url_password("s3://key:s3cr/et@bucket/lake") == ["s3cr/et"]
    assert url_password("abfss://container@account.dfs.core.windows.net/x") == []
    assert url_password("s3://bucket/dir:x@y") == []  # a ':' after the host: no password
