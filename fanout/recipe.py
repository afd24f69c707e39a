"""What a :class:`fanout.FanOut` is built from, kept so that it pickles as configuration.

Under Spark Connect the foreachBatch function is pickled on the client and called in a
Python process beside the server (docs/architecture.md §15). A built ``FanOut`` holds
locks, thread pools, the catch-up thread, open sinks and a SparkSession, none of which may
travel; its recipe holds only what ``FanOut(...)`` was given (sink instances copied before
``open()`` touched them), and the other side builds the pipeline again from it, with the
session of the batch it receives.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fanout.contract.sink import Sink
from fanout.errors import ConfigurationError
from fanout.sink_spec import SinkSpec


@dataclass(frozen=True)
class Recipe:
    """The arguments of one ``FanOut(...)``, safe to pickle.

    :param pipeline: the pipeline name.
    :param ledger: the ledger's path, or the ledger object as given (it must pickle).
    :param sinks: the sink configurations as given; sink instances (alone or in a
        :class:`fanout.sink_spec.SinkSpec`) are shallow copies taken before ``open()``.
    :param options: every other keyword argument but the SparkSession.
    """

    pipeline: str
    ledger: Any
    sinks: tuple[Any, ...]
    options: Mapping[str, Any]

    @classmethod
    def of(
        cls, pipeline: str, ledger: Any, sinks: Sequence[Any], options: Mapping[str, Any]
    ) -> Recipe:
        """The recipe of ``FanOut(pipeline, ledger, sinks, **options)``, taken before it
        opens anything."""
        return cls(pipeline, ledger, tuple(_unopened(s) for s in sinks), dict(options))

    def check_picklable(self) -> None:
        """Raise a :class:`fanout.ConfigurationError` naming the first part that cannot
        be pickled (a plugin or sink holding a lock, a connection, a session...)."""
        from pyspark import cloudpickle

        parts: list[tuple[str, Any]] = [("the ledger", self.ledger)]
        parts += [(f"sink {_name(s)!r}", s) for s in self.sinks]
        parts += [(f"plugin {p!r}", p) for p in self.options.get("plugins", ())]
        parts += [(f"option {k!r}", v) for k, v in self.options.items() if k != "plugins"]
        for what, part in parts:
            try:
                cloudpickle.dumps(part)
            except Exception as exc:
                raise ConfigurationError(
                    f"pipeline {self.pipeline!r}: {what} cannot be pickled ({type(exc).__name__}: "
                    f"{exc}), and a FanOut is pickled when Spark runs it elsewhere (Spark "
                    "Connect): keep only configuration in it, and create connections, locks "
                    "and clients when first used"
                ) from None


def _unopened(config: Any) -> Any:
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, SinkSpec):
        return replace(config, sink=copy.copy(config.sink))
    if isinstance(config, Sink):
        return copy.copy(config)
    return config


def _name(config: Any) -> str:
    if isinstance(config, Mapping):
        return str(config.get("name"))
    return str(getattr(getattr(config, "sink", config), "name", config))
