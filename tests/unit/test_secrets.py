"""Secrets: ${VAR} interpolation, and no secret in any error fanout logs, records or raises."""

from __future__ import annotations

import logging

import pytest

from fanout import BatchFailedError, BatchInfo, ConfigurationError, FanOut, Sink
from fanout.ledger.memory import MemoryLedger
from fanout.observe.secrets import SinkSecrets, expand_env, redact
from fanout.testing import ArrowFrame

PASSWORD = "s3cr3t-Pa55"


def test_expand_env_substitutes_and_defaults() -> None:
    env = {"PG_PASSWORD": PASSWORD}
    assert expand_env("postgresql://u:${PG_PASSWORD}@h/db", what="x", environ=env) == (
        f"postgresql://u:{PASSWORD}@h/db"
    )
    assert expand_env("${MISSING:-fallback}", what="x", environ=env) == "fallback"
    assert expand_env("no reference", what="x", environ=env) == "no reference"


def test_expand_env_names_the_missing_variable_not_a_value() -> None:
    with pytest.raises(ConfigurationError) as missing:
        expand_env("postgresql://u:${PG_PASSWORD}@h", what="sink 'pg' option 'url'", environ={})
    assert str(missing.value) == (
        "sink 'pg' option 'url': environment variable 'PG_PASSWORD' is referenced but not "
        "set; export PG_PASSWORD=... before starting the pipeline"
    )


def test_redact_masks_every_occurrence() -> None:
    assert redact(f"a {PASSWORD} b {PASSWORD}", [PASSWORD, ""]) == "a *** b ***"


class LeakySink(Sink):
    """Fails with its password in the error, as some drivers do."""

    def secret_values(self) -> list[str]:
        return [PASSWORD]

    def write(self, batch: object) -> int:
        try:
            raise OSError(f"connect to postgresql://u:{PASSWORD}@db failed")
        except OSError as inner:
            raise RuntimeError(f"cannot write: {inner}") from inner


def test_secret_never_reaches_errors_logs_or_ledger(caplog: pytest.LogCaptureFixture) -> None:
    import pyarrow as pa

    caplog.set_level(logging.DEBUG)
    ledger = MemoryLedger()
    fan = FanOut("p", ledger, [LeakySink("pg")], retries=0)
    with pytest.raises(BatchFailedError) as failed:
        fan.process(ArrowFrame(pa.table({"x": [1]})), BatchInfo("p", 0, "q"))
    error = failed.value
    texts = [str(error), repr(error), caplog.text]
    texts += [
        str(e) for e in (error.__cause__, error.failures["pg"], error.failures["pg"].__cause__)
    ]
    texts += [e.error or "" for e in ledger.entries]
    assert all(PASSWORD not in text for text in texts)
    assert "connect to postgresql://u:***@db failed" in str(error)
    assert [e.status for e in ledger.entries] == ["epoch", "failed"]


def test_expand_env_nested_defaults_and_no_reexpansion() -> None:
    env = {"PGPASSWORD": "p${NOT_A_REF}w", "HOST": "db"}
    url = "${PG_URL:-postgresql://u:${PGPASSWORD:-x}@${HOST}:5432/${DB:-shop}}"
    assert expand_env(url, what="x", environ=env) == "postgresql://u:p${NOT_A_REF}w@db:5432/shop"
    assert expand_env(url, what="x", environ={**env, "PG_URL": "sqlite://"}) == "sqlite://"
    with pytest.raises(ConfigurationError) as unclosed:
        expand_env("${PG_URL:-abc", what="sink 'pg' option 'url'", environ={})
    assert "is not closed" in str(unclosed.value)


@pytest.mark.parametrize(
    ("reference", "environ", "expected"),
    [
        ("${SPOOL:-/data/spool}", {}, "/data/spool"),  # unset: the default
        ("${SPOOL:-/data/spool}", {"SPOOL": ""}, "/data/spool"),  # empty: the default
        ("${SPOOL:-/data/spool}", {"SPOOL": "/x"}, "/x"),
        ("${SPOOL-/data/spool}", {}, "/data/spool"),  # unset: the default
        ("${SPOOL-/data/spool}", {"SPOOL": ""}, ""),  # empty stays empty
        ("${SPOOL-/data/spool}", {"SPOOL": "/x"}, "/x"),
        ("${SPOOL}", {"SPOOL": ""}, ""),  # set, though empty: no error
        ("${SPOOL:-}", {"SPOOL": ""}, ""),
        ("${SPOOL-}", {}, ""),
        ("a${SPOOL:-${ROOT-/r}/spool}b", {"SPOOL": ""}, "a/r/spoolb"),
        ("${SPOOL-${ROOT:-/r}}", {"ROOT": ""}, "/r"),
        ("${SPOOL:-x-y}", {}, "x-y"),  # a '-' inside the default is the default's
    ],
)
def test_expand_env_defaults_as_the_shell_does(
    reference: str, environ: dict[str, str], expected: str
) -> None:
    """``${NAME:-default}`` when unset or empty, ``${NAME-default}`` when unset only:
    what sh, bash, docker compose and python-dotenv do."""
    assert expand_env(reference, what="pipeline.spool", environ=environ) == expected


def test_expand_env_an_unclosed_default_without_colon_is_refused() -> None:
    with pytest.raises(ConfigurationError) as unclosed:
        expand_env("${SPOOL-/data", what="pipeline.spool", environ={})
    assert str(unclosed.value) == (
        "pipeline.spool: the default of a ${NAME:-default} or ${NAME-default} reference is "
        "not closed; add the '}'"
    )


def test_a_short_secret_is_masked_where_it_stands_alone_not_inside_words() -> None:
    """A Kafka ``sasl.username`` of ``u`` turned "minutes" into "min***tes"."""
    said = '5 minutes; user=u, u:pw@host, "u", min_u, upload'
    assert redact(said, ["u", "pw"]) == '5 minutes; user=***, ***:***@host, "***", min_u, upload'
    assert redact("about ab, tab (ab)", ["ab"]) == "about ***, tab (***)"
    # from 8 characters on (SHORT_SECRET), a secret is masked inside words too
    assert redact("xhunt3ry hunt3r", ["hunt3r"]) == "xhunt3ry ***"
    assert redact("id=xhunter22y hunter22", ["hunter22"]) == "id=x***y ***"


def test_an_escape_before_a_short_secret_ends_the_word_before_it() -> None:
    """``\\n``, ``%22`` and ``\\x41`` end in a letter or digit, yet the secret stands alone."""
    said = r"%22ab%22 line\nab x\x41ab \u00e9ab about"
    assert redact(said, ["ab"]) == r"%22***%22 line\n*** x\x41*** \u00e9*** about"


def test_url_encoded_spellings_of_a_secret_are_masked() -> None:
    said = "postgresql://app:p%40ss%2Fw@db/x, p%40ss/w, p@ss%2fw, p%40SS/w"
    assert redact(said, ["p@ss/w"]) == "postgresql://app:***@db/x, ***, ***, p%40SS/w"
    assert redact("q=a+b%2Bc&r=a%20b+c&s=a b+c", ["a b+c"]) == "q=***&r=***&s=***"
    assert redact("caf%C3%A9 caf%c3%a9 café", ["café"]) == "*** *** ***"


def test_json_and_repr_spellings_of_a_secret_are_masked() -> None:
    import json

    secret = 'pa"ss\\w0rd'
    assert repr(secret) == "'pa\"ss\\\\w0rd'" and json.dumps(secret) == '"pa\\"ss\\\\w0rd"'
    assert redact(f"got {secret!r}", [secret]) == "got '***'"
    assert redact(json.dumps({"pw": secret}), [secret]) == '{"pw": "***"}'
    assert redact(str({"pw": secret}), [secret]) == "{'pw': '***'}"
    assert redact(json.dumps({"m": repr(secret)}), [secret]) == '{"m": "\'***\'"}'
    assert redact(json.dumps(repr(secret)), [secret]) == "\"'***'\""
    control = "clé\nx=1"
    assert redact(json.dumps(control) + " " + repr(control), [control]) == "\"***\" '***'"


def test_overlapping_secrets_are_masked_as_one() -> None:
    assert redact("abcdefghXYZ!", ["abcdefgh", "ghXYZ"]) == "***!"
    assert redact("0123456789ab", ["01234567", "456789ab"]) == "***"
    assert redact("hunter2-passphrase, hunter2", ["hunter2", "hunter2-passphrase"]) == "***, ***"


def test_blank_secrets_mask_nothing() -> None:
    assert redact("a b\tc", [" ", "", "\t"]) == "a b\tc"


def test_an_error_holds_a_secret_only_where_redact_would_mask_it() -> None:
    from fanout.observe.secrets import masked_error

    late = RuntimeError("lag check gave up after 5 minutes")
    assert masked_error(late, ["u"], ConfigurationError) is None
    encoded = RuntimeError("cannot connect to postgresql://app:p%40ss@db")
    masked = masked_error(encoded, ["p@ss"], ConfigurationError)
    assert masked is not None
    assert str(masked) == "RuntimeError: cannot connect to postgresql://app:***@db"


def test_json_is_masked_value_by_value_as_its_printed_text_would_be() -> None:
    """``--json``'s document masked string by string (keys and nested lists too) masks what
    masking its printed text masked: a short password in a URL or a query value, a long
    one anywhere; only its numbers are left, which a password of digits would garble."""
    import json

    from fanout.observe.secrets import redact_json, redact_printed

    secrets = ["pw", 'p"w', "pä", PASSWORD, "ab12"]
    document = {
        "sinks": [
            {"last_error": "OperationalError: connection to postgresql://u:pw@h/db failed"},
            {"last_error": 'cannot reach postgresql://u:p"w@h/db'},
            [["nested s3://k:pä@bucket/x", f"its key {PASSWORD}"]],
        ],
        f"s3://k:ab12@bucket/{PASSWORD}": "https://h/x?sig=ab12&a=1",
        "rows": 12,
        "ok": True,
        "none": None,
        "pw": "a short one outside a URL is fanout's own word: left, as printed",
    }
    masked = redact_json(document, secrets)
    assert masked == json.loads(redact_printed(json.dumps(document, indent=2), secrets))
    assert masked["sinks"][0]["last_error"] == (
        "OperationalError: connection to postgresql://u:***@h/db failed"
    )
    assert masked["sinks"][2] == [["nested s3://k:***@bucket/x", "its key ***"]]
    assert masked["s3://k:***@bucket/***"] == "https://h/x?sig=***&a=1"
    assert (masked["rows"], masked["ok"], masked["none"]) == (12, True, None)


def test_a_letter_s_reason_is_masked_of_other_sinks_short_secrets_where_printed_text_is():
    """On the executors as in the ledger: the sink's own secrets wherever they stand alone,
    another sink's short password only in a URL's password or a query value (masked
    wherever it stands alone, ``batch`` turned every reason into nonsense)."""
    secrets = SinkSecrets(("pg",), ("pg", "batch", "abc12", "Other-sink-pw-2207"))
    reason = (
        "row of batch 3 refused (value abc12, user pg) by postgresql://u:batch@h/db?k=abc12 "
        "quoting Other-sink-pw-2207"
    )
    assert secrets.mask(reason) == (
        "row of batch 3 refused (value abc12, user ***) by postgresql://u:***@h/db?k=*** "
        "quoting ***"
    )
