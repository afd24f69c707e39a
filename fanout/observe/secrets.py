"""Secrets in configuration: environment interpolation and redaction.

Passwords and credentials must never reach logs, exceptions, ``fanout status`` or the
ledger. Configuration may reference them as ``${VARIABLE}`` (resolved with
:func:`expand_env`), and a sink lists the values it holds through
:meth:`fanout.Sink.secret_values`, so fanout scrubs them from every error it logs, records
or raises (:func:`redact`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from fanout.contract.locations import query_secrets, written_passwords
from fanout.errors import ConfigurationError

MASK = "***"
E = TypeVar("E", bound=BaseException)
_NAME = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def expand_env(value: str, *, what: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace ``${NAME}`` with the environment variable ``NAME``. As in the shell,
    ``${NAME:-default}`` gives ``default`` when ``NAME`` is unset or empty, and
    ``${NAME-default}`` only when it is unset (an empty ``NAME`` stays empty); defaults may
    nest references. Substituted values are not expanded again.

    :param what: names the option in the error, e.g. ``"sink 'pg' option 'url'"``.
    :raises ConfigurationError: when a referenced variable is not set and has no default
        (every such variable of ``value`` named in one error), or a reference is not
        closed; the message names the variables, never a value.
    """
    env = os.environ if environ is None else environ
    unset: list[str] = []
    text, _end = _expand(value, 0, env, what, nested=False, unset=unset)
    names = list(dict.fromkeys(unset))  # a variable named twice is said once
    if len(names) == 1:
        raise ConfigurationError(
            f"{what}: environment variable {names[0]!r} is referenced but not set; "
            f"export {names[0]}=... before starting the pipeline"
        )
    if names:
        raise ConfigurationError(
            f"{what}: environment variables {', '.join(map(repr, names))} are referenced "
            f"but not set; export {' '.join(f'{n}=...' for n in names)} before starting "
            "the pipeline"
        )
    return text


def _expand(
    value: str, pos: int, env: Mapping[str, str], what: str, *, nested: bool, unset: list[str]
) -> tuple[str, int]:
    """Expand from ``pos`` to the end, or (``nested``) to the ``}`` closing a default."""
    out: list[str] = []
    while pos < len(value):
        if nested and value[pos] == "}":
            return "".join(out), pos
        match = _NAME.match(value, pos)
        if not match:
            out.append(value[pos])
            pos += 1
            continue
        name, pos = match.group(1), match.end()
        default, or_empty = None, False
        in_default: list[str] = []  # unset in the default: said only if the default is used
        for marker in (":-", "-"):
            if value.startswith(marker, pos):
                or_empty = marker == ":-"
                default, pos = _expand(
                    value, pos + len(marker), env, what, nested=True, unset=in_default
                )
                break
        if not value.startswith("}", pos):
            raise ConfigurationError(f"{what}: unclosed reference ${{{name}...")
        pos += 1
        found = env.get(name)
        if found is not None and not (or_empty and found == ""):
            out.append(found)
        elif default is not None:
            out.append(default)
            unset.extend(in_default)
        else:
            unset.append(name)  # said with the value's others (expand_env)
    if nested:
        raise ConfigurationError(
            f"{what}: the default of a ${{NAME:-default}} or ${{NAME-default}} reference "
            "is not closed; add the '}'"
        )
    return "".join(out), pos


SECRET_OPTION_WORDS = ("secret", "password", "passphrase", "token", "key", "sas", "credential")
"""Words that make an option's value a secret (``AWS_SECRET_ACCESS_KEY``,
``azure_storage_account_key``, ``azure_storage_sas_token``, ``google_service_account_key``).
A word matches whole parts of the option's name (split at ``.``, ``_``, ``-`` and camelCase,
a plural ``s`` allowed), so ``sas`` does not match ``sasl`` nor ``key`` ``keytab``; a dotted
word (``ssl.key``) matches consecutive parts."""

NOT_SECRET_SUFFIXES = (
    "url", "uri", "endpoint", "location", "file", "path", "enabled", "type", "cb"
)  # fmt: skip
"""Last name parts of options that say where or how a credential is found, not the credential
(``aws_web_identity_token_file``, ``azure_fabric_token_service_url``,
``aws_container_credentials_full_uri``, ``aws_sse_bucket_key_enabled``,
``azure_credential_type``, librdkafka's ``sasl.oauthbearer.token.endpoint.url``,
``ssl.key.location``): readable in diagnostics. A password inside such a URL is still a
secret (:func:`url_password`)."""

NOT_SECRET_NAMES = ("kms.key.id", "force.credential.load", "application.credentials")
"""Name parts of object_store and delta-rs options that hold no secret though they contain a
secret word: a KMS key's id (``aws_sse_kms_key_id``, not key material), a flag
(delta-rs ``AWS_FORCE_CREDENTIAL_LOAD``), a path to a credentials file
(``google_application_credentials``)."""

SHORT_SECRET = 8
"""Secrets shorter than this many characters are masked only where they stand alone (see
:func:`redact`): a string that short occurs by chance inside ordinary words (a user ``u`` in
"minutes", ``ab`` in "about"), while credentials meant to be secret are longer (NIST SP
800-63B's minimum password length is 8; generated keys and tokens are 20 and more), so a
longer secret found inside a word is the secret glued to something, and is masked there too."""


def secret_option_values(
    options: Mapping[str, Any] | None, words: Iterable[str] = SECRET_OPTION_WORDS
) -> list[str]:
    """The secrets among ``options`` (e.g. a Delta table's object-store ``storage_options``),
    to be scrubbed like passwords, each once, in the options' order: the values of options
    whose names contain one of ``words`` (:data:`SECRET_OPTION_WORDS`), unless the name says
    the value is where a credential is found (:data:`NOT_SECRET_SUFFIXES`,
    :data:`NOT_SECRET_NAMES`); and the password of any value that is a URL with
    ``user:password@``. An identifier masked with them costs nothing."""
    phrases = [_name_parts(word) for word in words]
    keep = [_name_parts(name) for name in NOT_SECRET_NAMES]
    found: list[str] = []
    for name, value in (options or {}).items():
        if value is None or not str(value):
            continue
        parts = _name_parts(str(name))
        secret = any(_holds(parts, p) for p in phrases) and not _names_a_place(parts, keep)
        found.extend([str(value)] if secret else url_password(str(value)))
    return list(dict.fromkeys(found))


def url_password(value: str) -> list[str]:
    """The password of a URL ``scheme://user:password@host...`` as written and decoded,
    read up to the first ``@`` (as SQLAlchemy reads it) and, when its authority holds
    another, up to the last and in its parts
    (:func:`fanout.contract.locations.written_passwords`); ``[]`` for any other text."""
    written = written_passwords(value)
    return list(dict.fromkeys(form for part in written for form in (part, unquote(part))))


def location_secrets(value: Any) -> list[str]:
    """The passwords of every URL with ``user:password@`` in ``value``: a location (a
    checkpoint, spool, ledger or table path) or a pipeline file's or command line's values,
    nested mappings and sequences walked, each once: a password (:func:`url_password`), also
    of a URL that does not begin the text (a ``dead_letter`` written ``<kind>:<location>``:
    ``delta:s3://KEY:SECRET@bucket/dl``), and the values of a URI's secret query parameters
    (an Azure SAS's ``?sig=``: :func:`fanout.contract.locations.query_secrets`), as written
    and decoded. Registered as secrets
    (:func:`fanout.observe.logs.register_secrets`), they are masked wherever a location
    reaches a log, an error or the CLI's output."""
    found: list[str] = []
    if isinstance(value, str):
        found.extend(url_password(value))
        for url in _URL_PASSWORD.finditer(value):  # read as a location of its own
            found.extend(url_password(value[url.start() :]))
        for secret in query_secrets(value):  # ?sig=..., as written and decoded
            found.extend([secret, unquote(secret)])
    elif isinstance(value, Mapping):
        for item in value.values():
            found.extend(location_secrets(item))
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            found.extend(location_secrets(item))
    return list(dict.fromkeys(found))


def _name_parts(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1.\2", name)
    return [part for part in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if part]


def _names_a_place(parts: list[str], keep: list[list[str]]) -> bool:
    """Whether an option named ``parts`` says where or how a credential is found."""
    if parts and parts[-1] in NOT_SECRET_SUFFIXES:
        return True
    return any(_holds(parts, k) for k in keep)


def _holds(parts: list[str], phrase: list[str]) -> bool:
    """Whether ``phrase`` is a run of consecutive ``parts`` (each maybe plural)."""
    n = len(phrase)
    return n > 0 and any(
        all(part in (word, word + "s") for part, word in zip(parts[i : i + n], phrase, strict=True))
        for i in range(len(parts) - n + 1)
    )


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each occurrence of a secret replaced by ``***`` (occurrences of
    several secrets that overlap or touch by one ``***``).

    A secret is found in its own spelling and in the spellings text gives it: URL-encoded
    (``p%40ss`` for ``p@ss``, ``a+b`` or ``a%20b`` for ``a b``, any hex case) and escaped in
    JSON or Python ``repr`` (``\\"``, ``\\\\``, ``\\n``, ``\\u00e9``, also escaped again).
    A secret of :data:`SHORT_SECRET` characters or more is masked wherever it occurs; a
    shorter one only where it stands alone: not inside a word (letters, digits, ``_``), so
    a user ``u`` is masked in ``user=u``, ``u:pw@h`` and ``"u"`` but "minutes" stays as it
    is; an escape before it (``\\n``, ``%22``, ``\\x41``) counts as a word's end. Empty and
    blank secrets are ignored.
    """
    spans = _spans(text, secrets)
    if not spans:
        return text
    out: list[str] = []
    last = 0
    for start, end in spans:
        out.append(text[last:start])
        out.append(MASK)
        last = end
    out.append(text[last:])
    return "".join(out)


def redact_printed(text: str, secrets: Iterable[str]) -> str:
    """``text`` as the ``fanout`` command prints it: the password of every URL's
    ``scheme://user:password@`` and the value of every query parameter (``?password=``) in
    it masked where it is one of ``secrets`` (as :func:`redact` masks it), and the secrets
    of :data:`SHORT_SECRET` characters or more wherever they occur. A shorter one elsewhere
    is left: a whole command's output is mostly fanout's own words and numbers, which a
    password ``fanout`` or ``1`` would mask (``*** recover --config``,
    ``"last_committed_batch": ***``, no JSON); the errors and log lines it prints are masked
    of every secret before (:func:`redact`)."""
    found = [s for s in secrets if s and not s.isspace()]
    if not found:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + redact(m.group(2), found) + "@", text)
    text = _QUERY_VALUE.sub(lambda m: m.group(1) + redact(m.group(2), found), text)
    return redact(text, [s for s in found if len(s) >= SHORT_SECRET])


def redact_json(value: Any, secrets: Iterable[str]) -> Any:
    """``value``, parsed JSON, as the ``fanout`` command prints it with ``--json``: each
    string (a key too) masked as :func:`redact_printed` masks printed text; numbers,
    booleans and nulls as they are. Masking the JSON's text instead would turn a count or a
    time that holds a password of digits (``12345678``) into ``***``, which is no JSON; a
    number is never a secret's place."""
    found = [s for s in secrets if s and not s.isspace()]
    if not found:
        return value
    if isinstance(value, str):
        return redact_printed(value, found)
    if isinstance(value, Mapping):
        return {redact_printed(str(k), found): redact_json(v, found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_json(item, found) for item in value]
    return value


_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)([^@\s]*)@")
"""A URL's ``scheme://user:password@`` in running text; group 2 is the password."""
_QUERY_VALUE = re.compile(r"([?&][A-Za-z0-9_.\-]+=)([^&#\s\"']*)")
"""A URL's query parameter (``?password=...``, ``&sig=...``); group 2 is the value."""


def _spans(text: str, secrets: Iterable[str]) -> list[tuple[int, int]]:
    """Where ``secrets`` occur in ``text``: sorted, overlapping or touching spans merged."""
    masked: list[tuple[int, int]] = []
    inside: list[tuple[int, int, bool, bool]] = []  # short ones within a word, so far
    for secret in {s for s in secrets if s and not s.isspace()}:
        anywhere = len(secret) >= SHORT_SECRET
        free_start = anywhere or not _WORD.match(secret[0])
        free_end = anywhere or not _WORD.match(secret[-1])
        for match in _pattern(secret).finditer(text):
            start, end = match.span(1)
            alone_start = free_start or bool(_WORD_START.match(text, start))
            alone_end = free_end or not _WORD.match(text, end)
            if alone_start and alone_end:
                masked.append((start, end))
            else:
                inside.append((start, end, alone_start, alone_end))
    # a short secret next to (or overlapping) a masked one stands alone once that is masked
    grown = True
    while grown:
        grown = False
        for found in list(inside):
            start, end, alone_start, alone_end = found
            if (alone_start or _covered(masked, start - 1, start)) and (
                alone_end or _covered(masked, end - 1, end)
            ):
                masked.append((start, end))
                inside.remove(found)
                grown = True
    return _merged(masked)


def _covered(spans: list[tuple[int, int]], *positions: int) -> bool:
    """Whether one of ``positions`` is inside one of ``spans``."""
    return any(start <= pos < end for start, end in spans for pos in positions)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` sorted, those that overlap or touch joined."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


_WORD = re.compile(r"\w")
_WORD_START = re.compile(
    r"(?:(?<!\w)|(?<=%[0-9A-Fa-f]{2})|(?<=\\[abfnrtv0])|(?<=\\x[0-9A-Fa-f]{2})"
    r"|(?<=\\u[0-9A-Fa-f]{4})|(?<=\\U[0-9A-Fa-f]{8}))"
)
"""Matches where a word starts: after a non-word character or an escape (``%22``, ``\\n``)."""
_NAMED_ESCAPES = {"\n": "n", "\r": "r", "\t": "t", "\b": "b", "\f": "f", "\v": "v", "\a": "a"}


@functools.lru_cache(maxsize=1024)
def _pattern(secret: str) -> re.Pattern[str]:
    """Finds ``secret`` in any of its spellings; group 1 is the occurrence. A lookahead, so
    occurrences that overlap are all found."""
    return re.compile("(?=(" + "".join(_spellings(char) for char in secret) + "))")


def _spellings(char: str) -> str:
    """A pattern for ``char`` as written, URL-encoded or escaped (JSON, ``repr``)."""
    if char.isascii() and char.isalnum():
        return char
    encoded = "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    forms = [f"(?i:{encoded})"]
    if char == "\\":
        forms.append(r"\\+")
    elif char.isascii() and char.isprintable():
        forms.append(r"\\*" + re.escape(char))
        if char == " ":
            forms.append(r"\+")
    else:
        forms.append(re.escape(char))
        forms.append(r"\\+(?i:" + "|".join(_escapes(char)) + ")")
    return "(?:" + "|".join(forms) + ")"


def _escapes(char: str) -> list[str]:
    """The backslash escapes of a control or non-ASCII ``char``, without the backslash."""
    code = ord(char)
    found = [_NAMED_ESCAPES[char]] if char in _NAMED_ESCAPES else []
    if code < 0x100:
        found.append(f"x{code:02x}")
    if code <= 0xFFFF:
        found.append(f"u{code:04x}")
    else:
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        found += [f"U{code:08x}", f"u{high:04x}\\\\+u{low:04x}"]
    return found


def redact_apart(text: str, own: Iterable[str], others: Iterable[str]) -> str:
    """``text``, one sink's error, masked of ``own`` (that sink's secrets) as :func:`redact`
    masks them, and of ``others`` (the rest of its pipeline's: its other sinks', its
    locations') as :func:`redact_printed` masks printed text: where a URL's password or a
    query value is one of them, and anywhere when it has :data:`SHORT_SECRET` characters or
    more. Another sink's short password (``batch``, ``0``) masked wherever it stands alone
    would turn this sink's error into nonsense (``sink 'a', *** 0``)."""
    return redact_printed(redact(text, own), others)


@dataclass(frozen=True)
class SinkSecrets:
    """A sink's secrets and its pipeline's, shipped with the sink's tasks to the executors:
    :meth:`mask` masks the text the sink writes itself, beyond its errors (which fanout
    masks): a dead letter's reason, which may quote its server's message.

    :param own: the sink's :meth:`fanout.Sink.secret_values`.
    :param others: the rest of its pipeline's (:attr:`fanout.SinkContext.secrets`).
    """

    own: tuple[str, ...] = ()
    others: tuple[str, ...] = ()

    def mask(self, text: str) -> str:
        """``text`` masked as :func:`redact_apart` masks one sink's error. Called for a
        refused row's reason only, never per written row."""
        if not self.own and not self.others:
            return text
        return redact_apart(text, self.own, self.others)


NO_SECRETS = SinkSecrets()
"""A writer's secrets outside a :class:`fanout.FanOut` (none to mask)."""


def masked_error(
    error: BaseException,
    secrets: Iterable[str],
    rebuild: Callable[[str], E],
    said: str | None = None,
    *,
    others: Iterable[str] = (),
) -> E | None:
    """``None`` when no message in ``error``'s chain holds one of ``secrets``, nor one of
    ``others`` where :func:`redact_apart` masks them; else the error ``rebuild`` makes of
    its text (``said``, by default ``"<type>: <message>"``) with them masked, its chain cut
    so that no traceback shows them."""
    found, rest = list(secrets), list(others)
    chain = error_chain(error)
    if not holds_secret(error, found) and not any(
        redact_printed(str(e), rest) != str(e) for e in chain
    ):
        return None
    text = f"{type(error).__name__}: {error}" if said is None else said
    masked = rebuild(redact_apart(text, found, rest))
    masked.__cause__ = None
    masked.__suppress_context__ = True
    return masked


def holds_secret(error: BaseException, secrets: Iterable[str]) -> bool:
    """Whether any message in ``error``'s chain (causes and contexts) holds one of
    ``secrets``, where and as :func:`redact` would mask it."""
    chain_text = "\n".join(str(e) for e in error_chain(error))
    return bool(_spans(chain_text, secrets))


def error_chain(error: BaseException) -> list[BaseException]:
    """``error``, then its causes and contexts, each once."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
