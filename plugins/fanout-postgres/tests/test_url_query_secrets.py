"""A password given in the URL's query string (libpq reads ``?password=`` and
``?sslpassword=``) is masked and scrubbed like one given as ``user:password@``."""

from __future__ import annotations

import pytest
from fanout_postgres.url import display, resolve_url, secrets_of


def test_query_string_secrets_are_masked_and_known() -> None:
    url = resolve_url(
        "postgresql://app@db.example:5433/orders?password=S3cretQ&sslmode=require"
        "&sslpassword=k%2Fey",
        sink="pg",
    )
    assert display(url) == (
        "postgresql+psycopg2://app@db.example:5433/orders"
        "?password=***&sslmode=require&sslpassword=***"
    )
    assert secrets_of(url) == ("S3cretQ", "k/ey", "k%2Fey")


def test_a_url_without_secrets_in_its_query_is_shown_as_it_is() -> None:
    url = resolve_url("postgresql://app:p%40w@db/orders?sslmode=require", sink="pg")
    assert display(url) == "postgresql+psycopg2://app:***@db/orders?sslmode=require"
    assert secrets_of(url) == ("p@w", "p%40w")


def test_a_variable_naming_the_whole_url_is_expanded_before_parsing() -> None:
    environ = {"PG_URL": "postgresql://app:p%40w@db:5433/orders?host=%2Ftmp", "PW": "x"}
    url = resolve_url("${PG_URL}", sink="pg", environ=environ)
    assert (url.password, url.host, url.port, url.database) == ("p@w", "db", 5433, "orders")
    assert url.query == {"host": "/tmp"}
    parts = resolve_url("postgresql://app:${PW}@db/orders", sink="pg", environ=environ)
    assert parts.password == "x"


def test_every_secret_keyword_of_libpq_18_is_masked_and_paths_are_not() -> None:
    """libpq 18's ``PQconndefaults`` shows ``password``, ``sslpassword`` and
    ``oauth_client_secret`` as passwords; the SCRAM keys stand in for a password;
    ``sslkey`` and ``passfile`` are paths."""
    url = resolve_url(
        "postgresql://app@db/orders?oauth_client_id=fanout&oauth_client_secret=0c-S3cret"
        "&scram_client_key=Q2xp&scram_server_key=U2Vy&sslkey=%2Fetc%2Fpg.key"
        "&passfile=%2Froot%2F.pgpass",
        sink="pg",
    )
    assert display(url) == (
        "postgresql+psycopg2://app@db/orders?oauth_client_id=fanout&oauth_client_secret=***"
        "&passfile=%2Froot%2F.pgpass&scram_client_key=***&scram_server_key=***"
        "&sslkey=%2Fetc%2Fpg.key"
    )
    assert secrets_of(url) == ("0c-S3cret", "Q2xp", "U2Vy")


AT_PASSWORD = "Secr@t-Passw0rd-77"  # its "@" not written %40
REST = "t-Passw0rd-77"


def test_a_password_with_an_unescaped_at_sign_is_masked_in_the_host_libpq_quotes() -> None:
    """SQLAlchemy ends the password at its first ``@`` and reads the rest as the host,
    which libpq's error quotes; before, the sink masked the first part only, and its
    ``display`` showed the rest: ``app:***@t-Passw0rd-77@127.0.0.1``."""
    from fanout_postgres import PostgresSink

    from fanout.contract.sink import SinkContext
    from fanout.errors import ConfigurationError, SinkUnreachableError

    raw = f"postgresql+psycopg2://app:{AT_PASSWORD}@127.0.0.1:1/shop"
    url = resolve_url(raw, sink="pg")
    assert (url.password, url.host) == ("Secr", f"{REST}@127.0.0.1")
    assert display(url) == "postgresql+psycopg2://app:***@127.0.0.1:1/shop"
    assert set(secrets_of(url)) == {"Secr", REST, AT_PASSWORD, "Secr%40t-Passw0rd-77"}
    sink = PostgresSink("pg", url=raw, table="orders")
    # the sink refuses such a url before connecting (it was a SinkUnreachableError quoting
    # libpq's "could not translate host name "***@127.0.0.1"", told to check the host)
    with pytest.raises(ConfigurationError) as caught:
        sink.open(SinkContext("open"))
    message = str(caught.value)
    assert not isinstance(caught.value, SinkUnreachableError)
    assert message.startswith(
        "postgres sink 'pg': option 'url' holds an '@' not escaped before its host"
    ), message
    assert REST not in message and "Secr" not in message
    assert repr(sink) == (
        "<PostgresSink 'pg' upsert 'orders' at postgresql+psycopg2://app:***@127.0.0.1:1/shop>"
    )
