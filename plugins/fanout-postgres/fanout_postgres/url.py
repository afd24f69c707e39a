"""The ``url`` option: a SQLAlchemy URL whose parts may reference environment variables.

The URL is parsed first and each part expanded afterwards, so a password such as
``p@ss/w%rd`` coming from ``${ORDERS_PG_PASSWORD}`` needs no URL escaping. The password never
leaves this module in clear text except inside the ``URL`` object used to connect: anything
shown uses :func:`display`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, quote_plus

from fanout.contract.locations import shown_location
from fanout.observe.secrets import expand_env

DRIVERS = ("postgresql", "postgresql+psycopg2")
"""Accepted URL schemes: the sink writes with psycopg2's COPY support."""


def resolve_url(
    raw: Any,
    *,
    sink: str | None,
    environ: Mapping[str, str] | None = None,
    named: str = "option 'url'",
) -> Any:
    """Parse ``raw`` and expand ``${VAR}`` in every part; returns a SQLAlchemy ``URL``
    using the psycopg2 driver. A ``raw`` that starts with ``${`` (no URL does: it starts
    with its scheme) names the whole URL: expanded first, then parsed, its parts as they
    came. ``named`` is how messages name the URL (``fanout migrate``: ``"--url"``), after
    the sink when there is one. Raises ``ValueError`` with a message free of the
    password."""
    from sqlalchemy.engine import URL, make_url

    where = named if sink is None else f"sink {sink!r} {named}"
    whole = isinstance(raw, str) and raw.startswith("${")
    if whole:
        raw = expand_env(raw, what=where, environ=environ)
    if isinstance(raw, URL):
        url = raw
    elif isinstance(raw, str) and raw:
        try:
            url = make_url(raw)
        except Exception:
            raise ValueError(
                f"{named} is not a SQLAlchemy URL (postgresql+psycopg2://user:pw@host/db)"
            ) from None
    else:
        raise ValueError(f"{named} is required: a SQLAlchemy URL of the target database")
    if url.drivername not in DRIVERS:
        raise ValueError(
            f"{named} uses driver {url.drivername!r}; the postgres sink writes with COPY "
            "through psycopg2: use postgresql:// or postgresql+psycopg2://"
        )

    def expand(value: str | None, part: str) -> str | None:
        if value is None or whole:
            return value
        return expand_env(value, what=f"{where} ({part})", environ=environ)

    query = {
        key: tuple(expand(v, f"query {key}") or "" for v in value)
        if isinstance(value, tuple)
        else (expand(value, f"query {key}") or "")
        for key, value in url.query.items()
    }
    return URL.create(  # not url.set(): there, None means "unchanged"
        "postgresql+psycopg2",
        username=expand(url.username, "user"),
        password=expand(url.password, "password") or None,
        host=expand(url.host, "host"),
        port=url.port,
        database=expand(url.database, "database"),
        query=query,
    )


def at_in_password(named: str = "option 'url'") -> str:
    """What to do about a URL holding an ``@`` not escaped before its host (in the
    password), the URL named as ``named``; no part of the URL shown (the rest of the
    password is read as the host)."""
    return (
        f"{named} holds an '@' not escaped before its host (in the password?): write '@' "
        "in the password as %40, or take the password from the environment "
        "(postgresql://user:${PGPASSWORD}@host/db: a password from ${VAR} needs no escaping)"
    )


def refuse_at_in_host(url: Any, named: str = "option 'url'") -> None:
    """Raise ``ValueError`` (:func:`at_in_password`) when the resolved ``url``'s host holds
    an ``@``: no host name does, so it is the rest of a password whose ``@`` was not written
    ``%40`` (SQLAlchemy ends the password at the first ``@``), which libpq would report as a
    host it cannot find, "unreachable: check the host and port". Called wherever a URL is
    taken to connect: the sink's ``url``, its ``postgres:`` dead letters, ``fanout migrate
    --url``."""
    if "@" in str(getattr(url, "host", None) or ""):
        raise ValueError(at_in_password(named))  # (its rest is a secret: not shown)


SECRET_QUERY_KEYS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
"""Query parameters libpq reads secrets from (``?password=`` works as well as ``user:pw@``):
the three libpq 18 shows as passwords (``PQconndefaults`` display ``*``) and the SCRAM keys
that stand in for a password (``require_auth``, ``sslkey`` and ``passfile`` are settings or
paths, shown as they are)."""


def _secret_query_values(url: Any) -> list[str]:
    found: list[str] = []
    for key, value in (getattr(url, "query", None) or {}).items():
        if key.lower() in SECRET_QUERY_KEYS:
            found.extend(value if isinstance(value, tuple) else (value,))
    return [v for v in found if v]


def secrets_of(url: Any) -> tuple[str, ...]:
    """The password and the secret query parameters, as given and in their URL-encoded
    spellings (all must be scrubbed). A password written with an ``@`` not escaped
    (``app:p@ss@db``) is cut there by SQLAlchemy, the rest read as the host (``ss@db``),
    which libpq's errors quote: that rest, and the password whole, are secrets too."""
    password = getattr(url, "password", None) or ""
    rest = str(getattr(url, "host", None) or "").rpartition("@")[0]
    cut = [rest, f"{password}@{rest}", *rest.split("@")] if rest else []
    values = [password, *cut, *_secret_query_values(url)]
    spellings = [s for v in values if v for s in (v, quote(v, safe=""), quote_plus(v))]
    return tuple(dict.fromkeys(spellings))


def display(url: Any) -> str:
    """The URL for logs and messages, password and secret query parameters masked."""
    if url is None:
        return "<no url>"
    query = url.query
    if any(key.lower() in SECRET_QUERY_KEYS for key in query):
        url = url.set(
            query={
                key: "***" if key.lower() in SECRET_QUERY_KEYS else v for key, v in query.items()
            }
        )
    shown = str(url.render_as_string(hide_password=True)).replace("=%2A%2A%2A", "=***")
    return shown_location(shown) if "@" in str(url.host or "") else shown  # app:***@db
