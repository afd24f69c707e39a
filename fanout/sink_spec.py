"""A sink as a pipeline holds it: the sink, its route and its retry policy.

A sink configured as a dict may carry, besides its own options, ``where`` and ``select``
(its :class:`fanout.routes.route.Route`), ``retries`` and ``backoff_s`` (its
:class:`fanout.retry.RetryPolicy` for transient errors) and ``on_failure``, ``max_lag`` and
``backfill_from`` (its :class:`LagPolicy`); :func:`split_core_options` separates them from
the sink's own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fanout.contract.options import CORE_OPTIONS
from fanout.contract.sink import Sink
from fanout.errors import ConfigurationError
from fanout.retry import RetryPolicy
from fanout.routes.route import Route

DEFAULT_MAX_LAG_BATCHES = 1000


@dataclass(frozen=True)
class LagPolicy:
    """What a sink's failure does to the other sinks (docs/architecture.md §14).

    :param on_failure: ``"stop"`` (default): the batch fails, the query stops, every sink
        waits. ``"lag"``: the other sinks go on; this sink's missed batches wait in the
        pipeline's spool and reach it in order, exactly once, when it works again.
    :param max_lag_batches: a lagging sink further behind than this many batches stops the
        query (``None``: no bound on batches).
    :param max_lag_s: a lagging sink whose oldest missed batch is older than this stops
        the query (``None``: no bound on age).
    :param backfill_from: the name of an append-mode, unrouted sink of the same pipeline
        whose batches this (new) sink receives first, in batch order, before going live.
    :param write_timeout_s: (``on_failure="lag"`` only) how long a live batch waits for
        this sink's write, all its attempts together; past it the batch goes on without
        the sink, which lags as if its write had failed (:mod:`fanout.steps.timeout`).
    """

    on_failure: str = "stop"
    max_lag_batches: int | None = DEFAULT_MAX_LAG_BATCHES
    max_lag_s: float | None = None
    backfill_from: str | None = None
    write_timeout_s: float | None = None

    @property
    def lags(self) -> bool:
        """Whether a failure of this sink lets the others go on."""
        return self.on_failure == "lag"

    @property
    def uses_spool(self) -> bool:
        """Whether this sink may need batches from the spool or a backfill source."""
        return self.lags or self.backfill_from is not None

    def describe_limit(self) -> str:
        """The bound, for errors and status: ``1000 batches``, ``3600 s``, both, or none."""
        parts = []
        if self.max_lag_batches is not None:
            parts.append(f"{self.max_lag_batches} batches")
        if self.max_lag_s is not None:
            parts.append(f"{self.max_lag_s:g} s")
        return " or ".join(parts) or "no limit"


@dataclass(frozen=True)
class SinkSpec:
    """A sink together with the settings fanout applies around it.

    Pass one to ``FanOut(sinks=[...])`` to route or tune a sink given as an instance:
    ``SinkSpec(MySink("x"), route=Route(where="amount > 0"), retry=RetryPolicy(5))``.
    """

    sink: Sink
    route: Route = field(default_factory=Route)
    retry: RetryPolicy | None = None
    lag: LagPolicy = field(default_factory=LagPolicy)

    @property
    def name(self) -> str:
        """The sink's name."""
        return self.sink.name


def split_core_options(
    name: str, options: Mapping[str, Any], default_retry: RetryPolicy
) -> tuple[dict[str, Any], Route, RetryPolicy | None, LagPolicy]:
    """Separate the options fanout applies around a sink (:data:`CORE_OPTIONS`) from the
    sink's own."""
    own = {k: v for k, v in options.items() if k not in CORE_OPTIONS}
    where = options.get("where")
    select = options.get("select")
    if where is not None and not (isinstance(where, str) and where.strip()):
        raise ConfigurationError(
            f"sink {name!r}: 'where' must be a non-empty SQL predicate, got {where!r} "
            f"({type(where).__name__})"
        )
    if select is not None:
        if isinstance(select, str):
            select = [select]
        if not (
            isinstance(select, Sequence)
            and select
            and all(isinstance(s, str) and s.strip() for s in select)
        ):
            raise ConfigurationError(
                f"sink {name!r}: 'select' must be a list of column names or SQL expressions, "
                f"got {select!r} ({type(select).__name__})"
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
    return own, Route(where, select), retry, lag_policy(name, options)


def lag_policy(name: str, options: Mapping[str, Any]) -> LagPolicy:
    """The :class:`LagPolicy` of a sink's ``on_failure``, ``max_lag``, ``backfill_from`` and
    ``write_timeout_s``.

    ``max_lag`` is a number of batches, or ``{"batches": N, "age_s": S}`` (either or both;
    ``0``/absent ``batches`` with an ``age_s`` bounds age only).
    """
    on_failure = options.get("on_failure", "stop")
    if on_failure not in ("stop", "lag"):
        raise ConfigurationError(
            f"sink {name!r}: on_failure must be 'stop' or 'lag', not {on_failure!r}"
        )
    batches: int | None = DEFAULT_MAX_LAG_BATCHES
    age: float | None = None
    raw = options.get("max_lag")
    if raw is not None:
        if isinstance(raw, Mapping):
            unknown = set(raw) - {"batches", "age_s"}
            if unknown:
                raise ConfigurationError(
                    f"sink {name!r}: max_lag takes 'batches' and 'age_s', not "
                    f"{', '.join(sorted(map(str, unknown)))}"
                )
            batches = _positive(name, "max_lag.batches", raw.get("batches"), int)
            age = _positive(name, "max_lag.age_s", raw.get("age_s"), float)
            if batches is None and age is None:
                raise ConfigurationError(f"sink {name!r}: max_lag needs 'batches' or 'age_s'")
        else:
            batches = _positive(name, "max_lag", raw, int)
    backfill = options.get("backfill_from")
    if backfill is not None and not (isinstance(backfill, str) and backfill.strip()):
        raise ConfigurationError(f"sink {name!r}: backfill_from must name another sink")
    timeout = _positive(name, "write_timeout_s", options.get("write_timeout_s"), float)
    policy = LagPolicy(on_failure, batches, age, backfill, timeout)
    if raw is not None and not policy.uses_spool:
        raise ConfigurationError(
            f"sink {name!r}: max_lag only applies with on_failure='lag' or backfill_from"
        )
    check_write_timeout(name, policy)
    return policy


def write_timeout(spec: SinkSpec) -> float | None:
    """The sink's ``write_timeout_s`` (``None``: its batch waits for its write)."""
    return spec.lag.write_timeout_s if spec.lag.lags else None


def write_timeouts(specs: Mapping[str, SinkSpec], names: Iterable[str]) -> dict[str, float]:
    """The :func:`write_timeout` of each sink of ``names`` that has one (a sink without is
    left out: its calls are waited for), as the steps bounding a sink's calls take them."""
    return {n: t for n in names if (t := write_timeout(specs[n])) is not None}


def check_write_timeout(name: str, policy: LagPolicy) -> None:
    """Refuse a ``write_timeout_s`` on a sink without ``on_failure="lag"``: a write
    abandoned at its timeout leaves the batch to the spool and the catch-up, which only a
    lag sink has."""
    if policy.write_timeout_s is None or policy.lags:
        return
    raise ConfigurationError(
        f"sink {name!r}: write_timeout_s={policy.write_timeout_s:g} only applies with "
        f"on_failure='lag', not {policy.on_failure!r}: a write past its timeout is abandoned "
        "and the batch goes on without the sink, which then has nowhere to get the batch "
        "from but the spool and the catch-up of a lagging sink. Set on_failure='lag' (and "
        "a spool), or remove write_timeout_s"
    )


def _positive(name: str, key: str, value: Any, kind: type) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"sink {name!r}: {key} must be a number, not {value!r}")
    if not math.isfinite(value):  # nan passes `<= 0`, and bounds nothing: every comparison false
        raise ConfigurationError(f"sink {name!r}: {key} must be finite, not {value}")
    if value <= 0 or (kind is int and value != int(value)):
        raise ConfigurationError(f"sink {name!r}: {key} must be a positive {kind.__name__}")
    return kind(value)


def check_exclusive_resources(pipeline: str, sinks: Iterable[Sink]) -> None:
    """Raise :class:`ConfigurationError` when two of ``sinks`` claim the same resource a
    sink must have to itself (:meth:`fanout.Sink.exclusive_resources`): they would fence
    or overwrite each other in every batch."""
    holders: dict[str, str] = {}
    for sink in sinks:
        for resource in sink.exclusive_resources(pipeline):
            other = holders.setdefault(resource, sink.name)
            if other != sink.name:
                raise ConfigurationError(
                    f"pipeline {pipeline!r}: sinks {other!r} and {sink.name!r} both use "
                    f"{resource}, which a sink must have to itself (they would fence or "
                    "overwrite each other in every batch): give each its own"
                )
