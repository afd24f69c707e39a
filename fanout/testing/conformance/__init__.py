"""A conformance suite any sink type runs from pytest in a few lines.

Subclass :class:`SinkConformance` in your plugin's tests and give it a fixture
``under_test`` returning a :class:`SinkUnderTest`: the sink's configuration and a way to
read what its target holds. The suite needs a ``spark`` fixture (a local SparkSession) and
checks, with the real sink and exact contents::

    import pytest
    from fanout.testing.conformance import SinkConformance, SinkUnderTest

    class TestMySink(SinkConformance):
        @pytest.fixture
        def under_test(self, tmp_path):
            return SinkUnderTest(
                config={"type": "mysink", "directory": str(tmp_path / "out")},
                read=lambda: read_my_target(tmp_path / "out"),  # rows with "id" and "v"
                dead_letter=str(tmp_path / "dead"),  # any dead_letter your sink takes
            )

Batches have two columns, ``id BIGINT`` and ``v STRING``; ``read`` returns the target's
rows as mappings holding at least ``id``. Every batch is processed in a thread of its own, so
``write()`` runs on another thread than ``open()``, as beside other sinks. The checks:
``write()`` off ``open()``'s thread as on it (a client bound to its thread, made in
``open()``, fails); a driver (a real subprocess) dying
between the sink's write and its ledger mark (``os._exit`` at that point: no ``finally``, no
``atexit``, nothing flushed, as ``kill -9`` leaves it), then the replay; the replay of
a marked batch (skipped) and of an unmarked one (no duplicate); an empty batch; schema
drift (a new column: refused by a :class:`fanout.SchemaMismatchError` naming it, or
written, as the sink declares); null keys
(refused naming the column, or dead-lettered once, also by a replay after a kill between
the commit and the hand-over: never dropped); rows failing a route go to the dead-letter
target; a route changed between a partial attempt (some pieces committed,
then a failure) and its replay is refused before any letter is written, or the replay's
outcome is exact (``commits_in_pieces``); a row the target itself refuses (when
``refused_value`` says which) ends in the dead letters once, not in the target, also when
the batch is replayed (both letter checks, with a local Delta ``dead_letter`` read by the
suite, delete the letters before the replay: a kill between the commit and the
hand-over); a batch of a new epoch (a checkpoint reset accepted with
``on_checkpoint_reset="new_epoch"``: batch ids start at 0 again) lands beside the old
epoch's batch of the same id; a secret of the configuration never appears in an error or a
log; and, when the sink implements the optional :meth:`fanout.Sink.holds_batch`, that it
says ``False`` before a batch is written and ``True`` after (the whole batch: not a
:class:`fanout.PartlyHeld`, which a sink answers only for a batch some of whose
partitions never committed, or whose refused rows are not in its dead-letter target yet);
when the sink implements the optional
:meth:`fanout.Sink.target_replaced`, that it says ``None`` about an empty batch and a batch
of rows just written (the same target) and, given ``recreate``, a reason once the target
was dropped and created again empty; when it implements :meth:`fanout.Sink.records_gone`,
that it says ``None`` about a batch just written and, given ``drop``, about a deleted
target; when :meth:`fanout.Sink.harmless_rewrite` gives a reason,
that a batch written again under a new epoch's idempotency key leaves the target as one
write did; when :meth:`fanout.Sink.deterministic_columns` names columns, that the batch
has them; when it implements :meth:`fanout.Sink.standing_problems`, that a sink built and
not opened (as ``fanout status --config`` asks it) says none before its target exists and
after a batch, and touches no file; when it implements :meth:`fanout.Sink.secret_values`
(and the case gives ``secret``), that a sink built from ``failing_config`` and not opened
names that secret, in a list of strings; when it implements
:meth:`fanout.Sink.lift_epoch_fence`, that it says no fence was lifted where none was,
that :meth:`fanout.Sink.fence_earlier_epochs` refuses a write of the epoch it closed, and
that the lift opens that epoch again to the write.

The sink type is found as ``FanOut`` finds it: through the ``fanout`` entry point of an
installed distribution (``pip install -e .`` of your plugin in the test environment), or,
without installing it, through ``plugins``: the modules registering it (``fanout_sink_types``),
each the module itself or its name, as ``FanOut(plugins=...)`` takes them; the kill check's
driver, a subprocess, imports them by name, with the directories this process imported
them from added to its ``sys.path`` behind the standard library and ahead of
site-packages (``env`` adds what else it needs).

The checks, by the part of the contract they hold the sink to (docs/architecture.md §8,
docs/architecture/08-sinks-and-plugins.md), each a module of this package that says which
hooks it asks: :mod:`~fanout.testing.conformance.replay` (replays, a kill between write and
mark, a new epoch), :mod:`~fanout.testing.conformance.holds` (``holds_batch``,
``records_gone``, ``target_replaced``, ``harmless_rewrite``),
:mod:`~fanout.testing.conformance.read_only` (what fanout's read-only checks ask, the
``secret_values`` of a sink not opened among them),
:mod:`~fanout.testing.conformance.fences` (the epoch fence),
:mod:`~fanout.testing.conformance.shapes` (an empty batch, schema drift),
:mod:`~fanout.testing.conformance.threads` (``write()`` off ``open()``'s thread),
:mod:`~fanout.testing.conformance.letters` (null keys, routes, dead letters) and
:mod:`~fanout.testing.conformance.secrets`; what a case gives is
:mod:`~fanout.testing.conformance.case`, what every check stands on
:mod:`~fanout.testing.conformance.kit`.
"""

from __future__ import annotations

from fanout.testing.conformance.case import NAME, SCHEMA, SinkUnderTest
from fanout.testing.conformance.fences import FenceChecks
from fanout.testing.conformance.holds import HoldsChecks
from fanout.testing.conformance.letters import DeadLetterChecks
from fanout.testing.conformance.read_only import ReadOnlyChecks
from fanout.testing.conformance.replay import ReplayChecks
from fanout.testing.conformance.secrets import SecretChecks
from fanout.testing.conformance.shapes import BatchShapeChecks
from fanout.testing.conformance.threads import ThreadChecks

__all__ = ["NAME", "SCHEMA", "SinkConformance", "SinkUnderTest"]


# pytest collects the tests of the last base first (reverse MRO): listed last to first, the
# suite runs in its order: the thread check first (a write failing off open()'s thread
# fails most checks; it says why), then the replays
class SinkConformance(
    SecretChecks,
    DeadLetterChecks,
    BatchShapeChecks,
    FenceChecks,
    ReadOnlyChecks,
    HoldsChecks,
    ReplayChecks,
    ThreadChecks,
):
    """The checks; subclass it and provide the ``under_test`` fixture (module docstring)."""
