"""Where a sink's dead letters go, now and before (docs/architecture.md §7)."""

from __future__ import annotations

from collections.abc import Mapping

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.earlier_letters import EarlierLetters
from fanout.contract.sink import Sink
from fanout.deadletters.moved import TargetMoves, earlier_letters
from fanout.deadletters.target import DeadLetterKind
from fanout.ledger.entry import Ledger, ledger_location


class Letters:
    """Each sink's dead-letter target (``targets``) and the earlier targets that may hold
    letters of a batch it has not marked (``moves``: :mod:`fanout.deadletters.moved`).

    :param kinds: the dead-letter kinds the plugins provide, by name.
    :param ledger: the pipeline's ledger, named in a refusal."""

    def __init__(
        self,
        targets: Mapping[str, DeadLetterTarget | None],
        sinks: Mapping[str, Sink],
        kinds: Mapping[str, DeadLetterKind],
        moves: TargetMoves,
        ledger: Ledger,
    ) -> None:
        self.targets = targets
        self.sinks = sinks
        self.kinds = kinds
        self.moves = moves
        self.ledger = ledger

    def target(self, name: str) -> DeadLetterTarget | None:
        """Where the rows failing sink ``name``'s route go (``None``: they fail it)."""
        return self.targets[name]

    def earlier(self, name: str, info: BatchInfo) -> EarlierLetters | None:
        """What sink ``name``'s earlier dead-letter targets hold of batch ``info``, one
        an earlier process may have attempted (``None``: no earlier target may hold any,
        read nothing); raises :class:`fanout.DeadLetterMovedError` when one cannot tell
        (:mod:`fanout.deadletters.moved`)."""
        texts = self.moves.earlier(name, (info.epoch, info.batch_id))
        if not texts:
            return None
        batch = Batch(None, info, name, txn_app_id(info.pipeline, name, info.epoch))
        return earlier_letters(
            batch,
            texts,
            self.targets[name],
            self.sinks[name],
            self.kinds,
            ledger_location(self.ledger),
        )
