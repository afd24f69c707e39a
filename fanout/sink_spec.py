"""A sink as a pipeline holds it: the sink, its route and its retry policy.

A sink configured as a dict may carry, besides its own options, ``where`` and ``select``
(its :class:`fanout.routes.route.Route`) and ``retries`` and ``backoff_s`` (its
:class:`fanout.retry.RetryPolicy` for transient errors); :func:`split_core_options`
separates them from the sink's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fanout.contract.sink import Sink
from fanout.errors import ConfigurationError
from fanout.retry import RetryPolicy
from fanout.routes.route import Route

CORE_OPTIONS = ("where", "select", "retries", "backoff_s")
"""Keys of a sink's dict configuration that fanout consumes itself."""


@dataclass(frozen=True)
class SinkSpec:
    """A sink together with the settings fanout applies around it.

    Pass one to ``FanOut(sinks=[...])`` to route or tune a sink given as an instance:
    ``SinkSpec(MySink("x"), route=Route(where="amount > 0"), retry=RetryPolicy(5))``.
    """

    sink: Sink
    route: Route = field(default_factory=Route)
    retry: RetryPolicy | None = None

    @property
    def name(self) -> str:
        """The sink's name."""
        return self.sink.name


def split_core_options(
    name: str, options: Mapping[str, Any], default_retry: RetryPolicy
) -> tuple[dict[str, Any], Route, RetryPolicy | None]:
    """Separate ``where``/``select``/``retries``/``backoff_s`` from a sink's own options."""
    own = {k: v for k, v in options.items() if k not in CORE_OPTIONS}
    where = options.get("where")
    select = options.get("select")
    if where is not None and not (isinstance(where, str) and where.strip()):
        raise ConfigurationError(f"sink {name!r}: 'where' must be a non-empty SQL predicate")
    if select is not None:
        if isinstance(select, str):
            select = [select]
        if not (
            isinstance(select, Sequence)
            and select
            and all(isinstance(s, str) and s.strip() for s in select)
        ):
            raise ConfigurationError(
                f"sink {name!r}: 'select' must be a list of column names or SQL expressions"
            )
        select = tuple(select)
    retry = None
    if "retries" in options or "backoff_s" in options:
        try:
            retry = RetryPolicy(
                retries=int(options.get("retries", default_retry.retries)),
                backoff_s=float(options.get("backoff_s", default_retry.backoff_s)),
                max_backoff_s=default_retry.max_backoff_s,
                jitter=default_retry.jitter,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"sink {name!r}: bad retries/backoff_s: {exc}") from None
    return own, Route(where, select), retry
