"""The secrets a :class:`fanout.fan_out.FanOut` knows, and the masking of an error that may
quote one (docs/architecture.md §5, the secrets masked)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fanout.contract.sink import Sink
from fanout.errors import FanoutError, error_with_text
from fanout.ledger.entry import Ledger
from fanout.observe.secrets import location_secrets, redact_apart, secret_option_values
from fanout.sink_spec import SinkSpec


def sink_option_secrets(
    configs: Sequence[Mapping[str, Any] | Sink | SinkSpec], sinks: Iterable[Sink]
) -> list[str]:
    """The passwords and secret query values (``?sig=``) of every location among the sinks'
    options (:func:`fanout.observe.secrets.location_secrets`): each ``dead_letter``, the
    options of a sink given as a dict, and the text and mapping attributes of each sink
    built (a plugin sink's ``archive = "s3://KEY:SECRET@..."``, its ``storage_options``'
    URLs). Read once, at construction; a sink's other attributes (objects, lists) are not
    walked."""
    given: list[Any] = [c for c in configs if isinstance(c, Mapping)]
    given += [c.sink for c in configs if isinstance(c, SinkSpec) and isinstance(c.sink, Mapping)]
    for sink in sinks:
        given.append(getattr(sink, "dead_letter", None))
        own = getattr(sink, "__dict__", None) or {}
        given.extend(v for v in own.values() if isinstance(v, str | Mapping))
    return location_secrets(given)


def ledger_secrets(ledger: str | Ledger) -> list[str]:
    """The secrets of ``ledger``, given as a location or as a ledger object (a
    :class:`fanout.ledger.delta.DeltaLedger` at ``s3://KEY:SECRET@bucket/...``, say): its
    location's password and the credentials among its ``storage_options``."""
    if isinstance(ledger, str):
        return location_secrets(ledger)
    path = getattr(ledger, "path", None)
    options = getattr(ledger, "storage_options", None)
    found = location_secrets(str(path)) if path is not None else []
    return found + secret_option_values(options if isinstance(options, Mapping) else None)


def gathered(locations: Sequence[str], sinks: Iterable[Sink]) -> tuple[str, ...]:
    """:attr:`fanout.fan_out.FanOut.secrets` as the ``locations``' secrets and the
    ``sinks`` (:meth:`fanout.Sink.secret_values`) give them now, each once, in order."""
    values = (value for sink in sinks for value in sink.secret_values())
    return tuple(dict.fromkeys([*locations, *values]))


def same_kind(
    error: FanoutError, secrets: Iterable[str], others: Iterable[str]
) -> Callable[[str], FanoutError]:
    """What rebuilds ``error`` from its masked text: an error of its own type (callers catch
    by type) with its fields (``sink``, ``batch_id``...) kept, their text masked too."""
    found, rest = list(secrets), list(others)

    def rebuild(text: str) -> FanoutError:
        fields = {
            field: redact_apart(value, found, rest) if isinstance(value, str) else value
            for field, value in vars(error).items()
        }
        return error_with_text(type(error), text, **fields)

    return rebuild
