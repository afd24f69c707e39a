"""A batch's route letters and the route that chose them (docs/architecture.md §8).

fanout writes the rows failing a sink's route to its dead-letter target at the start of
each attempt, before the sink's write, under the batch's transaction id: a replay finds
them there and writes them no more. That holds only while the replay runs the same route.
Under another route (the configuration was fixed between a failure and the restart) the
first route's letters would stay and the new route's would be skipped, while the sink is
written with the new route: a row only the new route refuses would be in neither place,
a row only the old route refuses in both.

So every target records the route's fingerprint and text
(:class:`fanout.contract.dead_letters.RouteStamp`) with the letters, atomically with them,
and a write of a batch whose letters are there under another fingerprint raises
:func:`changed_route` before anything is written.
The fingerprint covers the expressions and the Spark settings that change which rows
they refuse (:mod:`fanout.routes.settings`): a replay under another session time zone or
ANSI mode is refused like one under other expressions. Letters recorded without a
fingerprint (written before fanout recorded one), or under the fingerprint of the
expressions alone (:attr:`RouteStamp.earlier`: written before it covered the settings),
are of an unknown route or unknown settings: they are kept and the replay goes on, as
before, with a warning.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from fanout.errors import RouteError
from fanout.observe.logs import batch_fields

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, DeadLetterTarget, RouteStamp

log = logging.getLogger("fanout")


def write_route_letters(
    target: DeadLetterTarget, batch: Batch, letters: Sequence[DeadLetter], route: RouteStamp
) -> int:
    """Hand the batch's route letters (possibly none: the target still checks that no
    letters of another route hold the batch) to ``target`` with the route that chose them.

    A target whose ``write`` takes no ``route`` keyword (one written before it existed)
    gets the letters alone, as before, and cannot refuse a changed route.
    """
    if _takes_route(type(target)):
        return target.write(batch, letters, source="route", route=route)
    if not letters:
        return 0
    return target.write(batch, letters, source="route")


@lru_cache(maxsize=64)
def _takes_route(kind: type) -> bool:
    try:
        parameters = inspect.signature(kind.write).parameters.values()  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        return False
    return any(p.name == "route" or p.kind is p.VAR_KEYWORD for p in parameters)


def check_unchanged(
    batch: Batch,
    route: RouteStamp,
    *,
    fingerprint: str | None,
    recorded: str | None,
    target: str,
) -> None:
    """Refuse (raise :func:`changed_route`) when the batch's route letters in ``target``
    were recorded under another route; warn when their route is unknown (``fingerprint``
    ``None``: written before fanout recorded one) or only their expressions are known
    (a fingerprint of :attr:`RouteStamp.earlier`: written before it covered the settings).

    :param fingerprint: the fingerprint recorded with the letters.
    :param recorded: the recorded route's text (:attr:`RouteStamp.text`), when kept.
    :param target: the target for people (:meth:`DeadLetterTarget.describe`).
    """
    if fingerprint is None:
        _kept_unchecked(
            batch, target, "without the route that chose them (written by an older fanout): "
            "a replay under a changed route cannot be told",
        )  # fmt: skip
        return
    if fingerprint == route.fingerprint:
        return
    if fingerprint in route.earlier:
        _kept_unchecked(
            batch, target, "chosen by the same expressions under Spark settings an older "
            "fanout did not record: a replay under changed settings cannot be told",
        )  # fmt: skip
        return
    raise changed_route(batch, route, fingerprint, recorded, target)


def _kept_unchecked(batch: Batch, target: str, why: str) -> None:
    """Warn that the batch's route letters are kept without their route being compared."""
    log.warning(
        "pipeline %s, batch %s, sink %s: the %s holds this batch's route dead letters %s; "
        "they are kept as they are",
        batch.pipeline,
        batch.batch_id,
        batch.sink_name,
        target,
        why,
        extra=batch_fields(batch.pipeline, batch.batch_id, batch.sink_name),
    )


def changed_route(
    batch: Batch, route: RouteStamp, fingerprint: str, recorded: str | None, target: str
) -> RouteError:
    """The error of a replay whose route differs from the one its letters were kept under."""
    then = recorded or "another route"
    return RouteError(
        f"the route changed mid-batch: the {target} holds this batch's route dead letters "
        f"chosen by {then} (fingerprint {fingerprint}), but the sink's route is now "
        f"{route.text} (fingerprint {route.fingerprint}). Writing the batch with the "
        "new route would leave a row only it refuses in neither place and a row only the "
        "old one refuses in both. Restore the old route (its expressions and the Spark "
        "settings it names) until this batch completes, then change it",
        sink=batch.sink_name,
        batch_id=batch.batch_id,
    )
