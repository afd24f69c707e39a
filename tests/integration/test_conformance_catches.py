"""The conformance suite fails the mistakes a plugin author makes, each with a message
saying what the target holds and what ``write()`` must do: a sink naming its writes by
batch id (a new epoch's batch 0 overwrites the old one's), one without idempotency (a
replay appends again), one counting wrong. A sink naming its writes by its idempotency
token passes. Real local Spark and Delta ledger; the sinks are tests/integration/
kit_flawed_sinks.py, registered without installing them.

Each case of :data:`CATCHES` is a flawed sink, the suite's check that must fail it and the
message it must fail it with; the tests after it check what does not fit that table."""

from __future__ import annotations

import functools
import json
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import BatchFailedError
from fanout.testing.conformance import SinkConformance, SinkUnderTest
from tests.integration import kit_flawed_sinks
from tests.integration.kit_flawed_sinks import read_rows

SECRET = "T0ken-S3cret"


def _suite_and_case(kind: str, tmp_path: Path) -> tuple[SinkConformance, SinkUnderTest]:
    suite = SinkConformance()
    suite.pipeline = f"conformance{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    case = SinkUnderTest(
        config={"type": kind, "directory": str(out)},
        read=lambda: read_rows(out),
        plugins=[kit_flawed_sinks.__name__],
    )
    return suite, case


def _secret_case(kind: str, tmp_path: Path) -> tuple[SinkConformance, SinkUnderTest]:
    suite, case = _suite_and_case(kind, tmp_path)
    out = str(tmp_path / "out")
    case.secret = SECRET
    case.failing_config = {"type": kind, "directory": out, "token": SECRET}
    return suite, case


@dataclass(frozen=True)
class Catch:
    """A flawed sink of kit_flawed_sinks (``kind``) and the suite's ``check`` that fails it,
    raising ``raises`` with ``message`` (its first line where ``first_line``).

    ``case``: set on the sink's :class:`SinkUnderTest`; ``recreate``: the case drops its
    target directory and creates it again empty; ``secret``: the case declares a secret
    and a failing config holding it (the check then takes ``caplog`` too); ``dead_letter``:
    the case has a local Delta dead-letter table (``tmp_path / "dead"``)."""

    kind: str
    check: Callable[..., None]
    message: str = ""
    raises: type[BaseException] = AssertionError
    first_line: bool = False
    case: Mapping[str, Any] = field(default_factory=dict)
    recreate: bool = False
    secret: bool = False
    dead_letter: bool = False
    drop: bool = False

    def failure(self, spark: Any, tmp_path: Path, *extra: Any, **case: Any) -> str:
        """The text ``check`` fails the sink with (``extra``: the check's further fixtures;
        ``case``: set on the case too)."""
        suite, under_test = (_secret_case if self.secret else _suite_and_case)(self.kind, tmp_path)
        for name, value in {**self.case, **case}.items():
            setattr(under_test, name, value)
        if self.dead_letter:
            under_test.dead_letter = str(tmp_path / "dead")
        if self.recreate:
            out = tmp_path / "out"

            def recreate() -> None:
                shutil.rmtree(out)
                out.mkdir()

            under_test.recreate = recreate
        if self.drop:
            under_test.drop = functools.partial(shutil.rmtree, tmp_path / "out")
        with pytest.raises(self.raises) as failed:
            self.check(suite, spark, under_test, tmp_path, *extra)
        return str(failed.value)


_HOLDS = (
    "holds_batch(pipeline, epoch, batch_id) must look up the record write() keeps of that "
    "batch's idempotency key (app id txn_app_id(pipeline, self.name, epoch), from "
    "fanout.contract.batch, version batch_id): True when it finds it, False when not (a "
    "target not created yet holds nothing), None only when the sink cannot tell at all"
)
_ONCE = [(i, f"v{i}") for i in range(4)]
_RAISE_MISMATCH = (
    "raise SchemaMismatchError(message, sink=self.name, batch_id=batch.batch_id, "
    "columns=[...]) (from fanout import SchemaMismatchError) naming the columns the target "
    "lacks, in columns and in the message; implementing check_schema(schema) too, raising "
    "SchemaMismatchError(message, sink=self.name, columns=[...]) (no batch_id there), lets "
    "`fanout validate` refuse such a source before any batch is written "
    "(docs/writing-sinks.md: check_schema)"
)


def _null_key(kind: str, message: str, *, dead_letter: bool = False) -> Catch:
    """A sink the null-key check fails with ``message`` (its case keyed by ``id``; with a
    dead-letter target where ``dead_letter``)."""
    check = SinkConformance.test_a_null_key_is_refused_by_name_or_dead_lettered
    return Catch(
        kind, check, message, raises=pytest.fail.Exception, case={"keyed": True},
        dead_letter=dead_letter,
    )  # fmt: skip


def _re_created(kind: str, message: str) -> Catch:
    """A sink the target-replaced check fails with ``message``, its target dropped and
    created again empty."""
    check = SinkConformance.test_target_replaced_tells_a_target_created_again_empty
    return Catch(kind, check, message, recreate=True)


CATCHES = {
    "the_new_epoch_check_fails_a_sink_keyed_by_batch_id": Catch(
        "batch_id_files",
        SinkConformance.test_a_new_epoch_writes_beside_the_old_one,
        "the target holds ids [10, 11, 12, 13], expected [0, 1, 2, 10, 11, 12, 13], batch 0 "
        "of a new epoch (ids 10-13) after batch 0 of the old one (ids 0-2): key what write() "
        "records by batch.idempotency_key (app_id and version, or token), which a new epoch "
        "changes, never by batch_id alone",
        first_line=True,
    ),
    "a_sink_without_idempotency_fails_naming_what_the_target_holds": Catch(
        "appending_file",
        SinkConformance.test_replay_of_an_unmarked_batch_writes_no_duplicate,
        f"the target holds ids {sorted(list(range(6)) * 2)}, expected [0, 1, 2, 3, 4, 5], "
        "after the replay of a batch it had written whose ledger mark was lost: write() must "
        "find the record it keeps of batch.idempotency_key and return SinkResult(rows, "
        "already_written=True) without writing, or write idempotently (docs/writing-sinks.md: "
        "write(batch))",
        first_line=True,
    ),
    # pytest rewrites the suite's asserts too (fanout.testing registers it): a check without
    # a message of its own still says what it compared
    "any_failed_check_of_the_suite_shows_its_values": Catch(
        "writes_on_empty",
        SinkConformance.test_an_empty_batch_writes_nothing_and_is_marked,
        "assert [-1] == []",
        first_line=True,
    ),
    "a_sink_writing_a_new_column_said_to_refuse_it_is_told_how_to_say_so": Catch(
        "token_files",  # the default: "refuses"
        SinkConformance.test_schema_drift,
        "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink wrote "
        "it, and SinkUnderTest(schema_drift='refuses') (the default) says it refuses it: say "
        "schema_drift='writes' if it writes new columns, or raise a SchemaMismatchError "
        "naming the column",
        raises=pytest.fail.Exception,
    ),
    "a_holds_batch_blind_to_the_epoch_is_told_to_key_by_it": Catch(
        "holds_by_batch_id",
        SinkConformance.test_holds_batch_by_its_own_records,
        "holds_batch returned True for batch 0 of epoch 1, never written (only epoch 0's "
        f"batch 0 was), expected False: {_HOLDS}",
    ),
    "a_holds_batch_answering_a_part_for_a_whole_batch_is_told_to_say_true": Catch(
        "holds_a_part",
        SinkConformance.test_holds_batch_by_its_own_records,
        "holds_batch returned PartlyHeld(committed=1, partitions=1, letters=0) for batch 0 of "
        "epoch 0 after write() wrote all of it, expected True: PartlyHeld is the answer for a "
        "batch some of whose partitions never committed, or whose refused rows are not in the "
        "dead-letter target yet (letters=k); for a whole batch answer True (fanout records a "
        "lost mark only for True)",
    ),
    # its answer about the same target (None) passes; after the target is dropped and
    # created again empty it must give a reason
    "a_target_replaced_blind_to_a_re_created_target_is_told_to_give_a_reason": _re_created(
        "identity_blind",
        "target_replaced returned None about batch 1 of epoch 0 after the target it was "
        "written to was dropped and created again empty: expected a reason (the run's "
        "lost-target check refuses with it; holds_batch's records, which outlive the target, "
        "still say held)",
    ),
    # no identity recorded, only "empty": the same target after an empty batch reads
    # re-created (a target emptied by its retention or by hand would refuse the run)
    "a_target_replaced_that_reads_an_empty_target_as_replaced_is_told_to_say_none": _re_created(
        "replaced_when_empty",
        "target_replaced returned 'it holds no row' about batch 0 of epoch 0, an empty batch "
        "just written to the same target: expected None (a reason refuses the next run as a "
        "target lost; a target that holds no row is not one created again)",
    ),
    "a_records_gone_reason_about_a_batch_just_written_is_told_to_say_none": Catch(
        "records_always_gone",
        SinkConformance.test_records_gone_is_none_while_its_records_are_there,
        "records_gone returned 'its records are gone' about batch 0 of epoch 0 just written "
        "(its records there): expected None (a reason refuses the run with "
        "SinkRecordsGoneError)",
    ),
    "a_null_key_refused_without_its_column_is_told_to_name_it": _null_key(
        "null_key_unnamed",
        "the sink refused a batch with a null key with an error that does not name the key "
        "column: SinkWriteError(\"sink 'under_test', batch 0: a row has no key\"); name it, "
        "quoted: 'id'",
    ),
    # fanout refuses rows + dead_lettered above the rows routed: the suite said the sink
    # "refused a batch with a null key with an error that does not name the key column",
    # though the sink refused nothing and fanout refused its counts
    "a_null_key_counted_in_rows_too_is_told_its_counts_were_refused": _null_key(
        "null_key_counted_twice",
        "fanout refused the counts write() reported for a batch of ids 1, null, 2 (3 rows): "
        "sink 'under_test', batch 0: write() reported rows=3, dead_lettered=1, but their "
        "sum, 4, is more than the 3 rows routed to it in this batch (a refused row counts "
        "in dead_lettered only, not in rows too). A sink reports the rows of the batch it "
        "wrote (at most the rows it received) and the rows it refused; this is a bug in the "
        "sink, fix what its write() returns. The batch is not marked for this sink: a "
        "replay writes it again",
    ),
    "a_null_key_dropped_without_a_word_is_told_what_to_do": _null_key(
        "null_key_dropped",
        "a batch of ids 1, null, 2 left the target holding ids [1, 2] and "
        "SinkResult.dead_lettered=0, expected [1, 2] and 1: a row whose key is null is never "
        "written nor dropped without a word: refuse the batch naming the key column ('id'), "
        "or hand the row to the dead-letter target (context.dead_letters) and count it in "
        "SinkResult.dead_lettered",
    ),
    "a_new_column_refused_without_its_name_is_told_to_name_it": Catch(
        "new_column_unnamed",
        SinkConformance.test_schema_drift,
        "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink's "
        "write() refused it with SinkWriteError(\"sink 'under_test', batch 1: unexpected "
        "columns\"), not a SchemaMismatchError: a driver's error reaches the operator as a "
        "failed write, not as a schema mismatch naming the columns. Compare the batch's "
        f"columns with the target's in write() and {_RAISE_MISMATCH}",
        raises=pytest.fail.Exception,
    ),
    # a driver's error naming the column ("table t has no column named extra", wrapped by
    # fanout as a SinkWriteError naming sink and batch) passed as the refusal asked for
    "a_new_column_refused_by_the_drivers_error_is_told_to_raise_schema_mismatch": Catch(
        "driver_refuses_new_column",
        SinkConformance.test_schema_drift,
        "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink's "
        "write() refused it with SinkWriteError(\"sink 'under_test', batch 1: "
        'OperationalError: table t has no column named extra"), not a SchemaMismatchError: '
        "a driver's error reaches the operator as a failed write, not as a schema mismatch "
        "naming the columns. Compare the batch's columns with the target's in write() and "
        f"{_RAISE_MISMATCH}",
        raises=pytest.fail.Exception,
    ),
    "a_schema_mismatch_without_the_column_is_told_to_name_it": Catch(
        "new_column_mismatch_unnamed",
        SinkConformance.test_schema_drift,
        "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink refused "
        "it with a SchemaMismatchError that does not name the column: SchemaMismatchError("
        "\"sink 'under_test', batch 1: unexpected columns\") (columns=[]); "
        f"{_RAISE_MISMATCH}",
        raises=pytest.fail.Exception,
    ),
    # a holds_batch answering False for a batch it holds failed the new-epoch check with
    # fanout's TargetLostError, an operator's "target lost ... restore it"
    "a_holds_batch_false_about_its_last_mark_is_told_so_not_that_the_target_was_lost": Catch(
        "holds_by_a_file_never_written",
        SinkConformance.test_a_new_epoch_writes_beside_the_old_one,
        "FanOut refused batch 0 with TargetLostError: at a run's first batch fanout asks the "
        "sink whether its target still holds the last batch the ledger marks written "
        "(docs/writing-sinks.md: holds_batch), and holds_batch returned False about batch 0 "
        "of epoch 0, which the kit wrote to this target and left as it was: expected True "
        f"(False says the target was deleted or replaced, and refuses the run): {_HOLDS}",
        first_line=True,
    ),
    # and one answering True for a batch never written, with UnmarkedBatchError's "the
    # driver died in between ... fanout recover"
    "a_holds_batch_true_about_a_batch_never_written_is_told_so_not_that_it_is_unmarked": Catch(
        "holds_every_batch",
        SinkConformance.test_a_new_epoch_writes_beside_the_old_one,
        "FanOut refused batch 0 of a new epoch with UnmarkedBatchError: when a checkpoint "
        "reset starts a new epoch fanout asks the sink whether it holds the batch after its "
        "last mark (docs/writing-sinks.md: holds_batch), and holds_batch returned True about "
        "batch 1 of epoch 0, which the kit never wrote: expected False (True or a PartlyHeld "
        "says the sink wrote it and the driver died before its mark, and refuses the new "
        f"epoch): {_HOLDS}",
        first_line=True,
    ),
    # a sink whose harmless_rewrite() gives a reason lets a new epoch start over a batch it
    # holds whose mark was lost, and writes the batch again: the kit never checked that the
    # rewrite was harmless
    "a_rewrite_called_harmless_that_holds_the_rows_twice_is_told_to_return_none": Catch(
        "rewrite_claimed_harmless",
        SinkConformance.test_a_harmless_rewrite_leaves_the_target_as_one_write,
        f"harmless_rewrite() says '{kit_flawed_sinks.UPSERT_REASON}', but batch 0 written "
        f"again under a new epoch's idempotency key left the target holding (id, v) "
        f"{sorted(_ONCE * 2)}, not {_ONCE} as after one write: return None from "
        "harmless_rewrite() unless writing a held batch again leaves the target as one write "
        "would, for any input (an unconditional upsert by key does; an append, or dead "
        "letters kept beside it, does not)",
        first_line=True,
    ),
    # fanout's determinism check finds nothing to inspect for a column the batch lacks and
    # passes: the kit never checked the names
    # a type declaring guarantees = () (or none) passed every check, then ran as
    # at-least-once, warned about at each start
    "a_type_declaring_no_guarantee_is_told_to_declare_one": Catch(
        "guarantees_left_empty",
        SinkConformance.test_the_type_declares_the_guarantee_these_checks_hold_it_to,
        "sink type GuaranteesLeftEmpty declares no guarantees (left out, or ()), so fanout "
        "runs it as at_least_once and warns at every start, whatever these checks find: once "
        'the replay checks pass, declare guarantees = ("idempotent",) (a replay leaves the '
        'same state) or ("transactional",) (the rows and the record of batch.idempotency_key '
        "in one commit) on the class; a sink at-least-once by design says guarantees = "
        '("at_least_once",)',
        first_line=True,
    ),
    "a_deterministic_column_the_batch_lacks_is_told_to_use_the_batchs_name": Catch(
        "stable_by_target_name",
        SinkConformance.test_deterministic_columns_are_columns_of_the_batch,
        "deterministic_columns() names ['order_key'], not columns of the batch (id, v): "
        "fanout finds nothing to check for a name the batch lacks, so a route or source "
        "computing that column non-deterministically passes. Name the batch columns the "
        "sink keys or partitions by, as the batch spells them (its options' columns, not "
        'the target\'s), or "*" for the whole row',
        first_line=True,
    ),
    # the check ended in a bare ``assert False`` (``all(<generator>)``), naming neither
    # where the secret was nor what to do; and it built the failing sink without the case's
    # ``plugins``, so an uninstalled plugin failed as an unknown type and passed
    "a_secret_in_an_error_is_told_where_and_to_declare_it": Catch(
        "secret_quoted",
        SinkConformance.test_a_secret_never_appears_in_errors_or_logs,
        'the secret of failing_config appears in the error raised, its repr: "sink '
        "'under_test': token <secret> refused\". Return it from the sink's secret_values() "
        "(fanout then masks it in every error it raises or records and every log line), and "
        "keep it out of texts your sink builds itself",
        first_line=True,
        secret=True,
    ),
    # the null-key check ran without the case's dead_letter: a sink setting the row aside
    # only when given a target (refusing it by name otherwise) had its letters never
    # checked, and one counting a letter it never wrote passed
    "a_null_key_counted_dead_lettered_but_never_handed_over_is_told_to_hand_it_over": _null_key(
        "null_key_letters_unwritten",
        "a batch of ids 1, null, 2 left the dead-letter target holding [] (row id, source), "
        "expected [(None, 'refused')]: hand the null key's row to context.dead_letters (its "
        "write(batch, letters, source='refused')) once your commit of the others succeeded",
        dead_letter=True,
    ),
    # the kit's letters were always written by the first attempt before its replay, so a
    # sink whose replay did not hand them over again passed; a driver killed between its
    # commit and its hand-over then lost them (seen in a real run killed there)
    "a_null_key_not_handed_over_again_by_a_replay_is_told_to_hand_it_over": _null_key(
        "null_key_letters_not_handed_again",
        "after the replay of a batch of ids 1, null, 2 whose ledger mark was lost (and its "
        "refused row's hand-over: killed after the commit), the dead-letter target holds [] "
        "(row id, source), expected [(None, 'refused')] once: a replay that finds the batch "
        "committed hands over again the rows it refused, as recorded with that commit (the "
        "target keeps them once; docs/writing-sinks.md: Dead letters)",
        dead_letter=True,
    ),
    # the same for the refused-row check (refused_value): its replay found the first
    # attempt's letters in the target, so a replay handing nothing over passed
    "a_refused_row_not_handed_over_again_by_a_replay_is_told_to_hand_it_over": Catch(
        "refused_not_handed_again",
        SinkConformance.test_a_row_the_target_refuses_is_dead_lettered_once,
        "after the replay of a batch of ids 1, 2 (v 'refused': refused), 3 whose ledger mark "
        "was lost (and its refused row's hand-over: killed after the commit), the dead-letter "
        "target holds [] (row id, source), expected [(2, 'refused')] once: a replay that finds "
        "the batch committed hands over again the rows it refused, as recorded with that "
        "commit (the target keeps them once; docs/writing-sinks.md: Dead letters)",
        raises=pytest.fail.Exception,
        case={"refused_value": "refused"},
        dead_letter=True,
    ),
    # holds_batch by records kept beside the target, a deleted target still read held, so
    # the run's lost-target check never fired: the kit never deleted a target
    "a_holds_batch_answering_for_a_deleted_target_is_told_to_check_the_target": Catch(
        "records_outlive_target",
        SinkConformance.test_holds_batch_of_a_deleted_target_is_false,
        "holds_batch returned True for batch 0 of epoch 0 after drop() deleted the target it "
        "was written to, expected False: check that the target itself is there before "
        "asking records kept beside it, which outlive it (the run's lost-target check "
        "refuses with TargetLostError only on False)",
        drop=True,
    ),
    # the kit never opened a sink as `fanout validate` does: one promising read_only_check
    # whose open() created its target passed, and validate then created it
    "a_read_only_check_that_creates_its_target_is_told_to_check_without_creating": Catch(
        "checks_by_creating",
        SinkConformance.test_a_read_only_check_creates_nothing,
        "open() with context.checking (fanout validate; the class sets read_only_check = "
        "True) or check_schema() before its target exists created, changed or removed out "
        "under {tmp_path}: check without creating or changing anything (create the target "
        "at the first write), and say what a run would do with context.would(...)",
        raises=pytest.fail.Exception,
    ),
    # the check opened the sink only before its target existed: one whose open() removed
    # (or rewrote) something of an existing target under fanout validate passed
    "a_read_only_check_that_removes_a_file_of_a_written_target_is_told": Catch(
        "checks_by_removing_its_lock",
        SinkConformance.test_a_read_only_check_creates_nothing,
        "open() with context.checking (fanout validate; the class sets read_only_check = "
        "True) or check_schema() after a batch was written created, changed or removed "
        "out/_lock under {tmp_path}: check without creating or changing anything (create "
        "the target at the first write), and say what a run would do with "
        "context.would(...)",
        raises=pytest.fail.Exception,
    ),
    # the kit never asked standing_problems (fanout status --config): a sink reporting a
    # problem of a healthy target passed, and every status then showed it "to fix by hand"
    "a_standing_problem_of_a_healthy_target_is_told_to_say_none": Catch(
        "problems_always",
        SinkConformance.test_standing_problems_of_a_healthy_target_are_none,
        "standing_problems() before its target exists returned ['the directory may be "
        "damaged'], expected none: fanout status shows each under 'to fix by hand:', and a "
        "target fanout just wrote cleanly (or none yet) has nothing to fix",
        raises=pytest.fail.Exception,
    ),
    # ... and one creating what it looks at passed, and status created it
    "standing_problems_that_create_the_target_are_told_to_read_only": Catch(
        "problems_by_creating",
        SinkConformance.test_standing_problems_of_a_healthy_target_are_none,
        "standing_problems() before its target exists created, changed or removed out under "
        "{tmp_path}: fanout status asks it as it draws, and it must read only",
        raises=pytest.fail.Exception,
    ),
    # the kit never fenced nor lifted a fence: a sink saying it lifted one that was not
    # there passed, and `fanout ledger lift-fence` printed it lifted
    "a_lift_saying_lifted_with_no_fence_is_told_to_say_false": Catch(
        "lift_says_lifted",
        SinkConformance.test_lift_epoch_fence_opens_the_fenced_epoch_again,
        "lift_epoch_fence(pipeline, 1) returned True (lifted) before any fence, with no "
        "fence of epoch 0 there: `fanout ledger lift-fence` prints what it returns; return "
        "False when there was none, None when it cannot tell",
        raises=pytest.fail.Exception,
    ),
    # ... one leaving its fence passed, and the replaced checkpoint could never complete
    "a_lift_leaving_the_fence_is_told_to_remove_it": Catch(
        "lift_leaves_fence",
        SinkConformance.test_lift_epoch_fence_opens_the_fenced_epoch_again,
        "batch 1 of epoch 0 was refused after lift_epoch_fence(pipeline, 1) returned True: "
        "the lift must open epoch 0 again (its checkpoint is started again to complete a "
        "batch), removing the fence fence_earlier_epochs keeps",
        raises=pytest.fail.Exception,
        first_line=True,
    ),
    # ... and one whose fence closed nothing passed, and a replaced query's batch in flight
    # committed beside the new epoch's
    "a_fence_closing_nothing_is_told_to_refuse_the_fenced_write": Catch(
        "fence_leaves_open",
        SinkConformance.test_lift_epoch_fence_opens_the_fenced_epoch_again,
        "batch 1 of epoch 0 was written after fence_earlier_epochs(pipeline, 1) returned: "
        "once it returns, no write of an earlier epoch may commit (a replaced query still "
        "running would write its batch in flight beside the new epoch's); refuse it in "
        "write() (or in its tasks) by a fence the sink keeps with its records",
        raises=pytest.fail.Exception,
    ),
    # ... and one refusing the fenced write with a BaseException (fanout lets it go up as
    # raised, no BatchFailedError) crashed the check with it, not saying what to do
    "a_fenced_write_refused_with_a_base_exception_is_told_to_raise_an_exception": Catch(
        "fence_raises_base_exception",
        SinkConformance.test_lift_epoch_fence_opens_the_fenced_epoch_again,
        "the write of batch 1 of epoch 0 after fence_earlier_epochs(pipeline, 1) returned "
        "made FanOut.process raise FencedEpoch('epoch 0 is fenced'), not BatchFailedError: "
        "refuse a fenced write with an Exception (a fanout.SinkWriteError) from write() (or "
        "its tasks), which fanout reports as the sink's failure of the batch, while a "
        "BaseException that is not an Exception goes up through fanout as raised and ends "
        "the run, as KeyboardInterrupt does",
        raises=pytest.fail.Exception,
    ),
    # a dead_letter for a type without that option was a bare "unexpected keyword argument"
    # from building the sink, not saying that the kit's case asked for it
    "a_dead_letter_for_a_type_without_the_option_is_told_to_declare_it": Catch(
        "token_files",
        SinkConformance.test_rows_failing_the_route_go_to_the_dead_letter_target,
        "SinkUnderTest(dead_letter=...) is given, but sink type 'token_files' takes no "
        "dead_letter option (its options: directory, columns): declare one, "
        'SinkOption("dead_letter", "none", ...) and a keyword `dead_letter: str | None = '
        "None` stored as self.dead_letter (docs/writing-sinks.md: Dead letters), or "
        "leave dead_letter out of SinkUnderTest to skip the dead-letter checks",
        raises=pytest.fail.Exception,
        dead_letter=True,
    ),
}


@pytest.mark.parametrize("catch", CATCHES.values(), ids=CATCHES.keys())
def test_the_suite_fails_a_flawed_sink_saying_what_to_do(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, catch: Catch
) -> None:
    message = catch.failure(spark, tmp_path, *([caplog] if catch.secret else []))
    expected = catch.message.replace("{tmp_path}", str(tmp_path))
    assert (message.splitlines()[0] if catch.first_line else message) == expected


def test_a_client_made_in_open_fails_the_thread_check_saying_why(
    spark: Any, tmp_path: Path
) -> None:
    """A sqlite3 connection made in open() and used in write(): a FanOut of that sink alone
    wrote on open()'s thread and the kit passed it; beside a second sink every write
    failed. The thread check fails it saying so; the write on open()'s thread landed."""
    suite, case = _suite_and_case("connects_in_open", tmp_path)
    with pytest.raises(pytest.fail.Exception) as failed:
        suite.test_write_runs_on_another_thread_than_open(spark, case, tmp_path)
    assert re.sub(r"thread id \d+", "thread id N", str(failed.value)) == (
        "write() of batch 1, called on another thread than the one that ran open() (a FanOut "
        "of several sinks writes each in a thread of a pool made for the batch), failed: "
        "SinkWriteError(\"sink 'under_test', batch 1: ProgrammingError: SQLite objects "
        "created in a thread can only be used in that same thread. The object was created in "
        "thread id N and this is thread id N.\"); batch 0, written on open()'s thread, did "
        "not. A client bound to the thread that created it (a sqlite3 connection) cannot be "
        "made in open() and used in write(): make it in write() (one per write, or one per "
        "thread, e.g. in a threading.local), as docs/writing-sinks.md says (write(batch))"
    )
    assert case.ids() == [1]


def test_every_check_writes_off_the_thread_of_open(spark: Any, tmp_path: Path) -> None:
    """Not only the thread check: a replay check fails the same sink too, its write
    refused off open()'s thread (the kit's FanOut processes each batch in a thread of its
    own)."""
    suite, case = _suite_and_case("connects_in_open", tmp_path)
    with pytest.raises(BatchFailedError) as failed:
        suite.test_replay_of_a_marked_batch_is_skipped(spark, case, tmp_path)
    assert "SQLite objects created in a thread" in str(failed.value.failures["under_test"])
    # the check losing the mark on purpose said only "the target holds ids []"
    with pytest.raises(pytest.fail.Exception) as told:
        suite.test_replay_of_an_unmarked_batch_writes_no_duplicate(spark, case, tmp_path)
    assert re.sub(r"thread id \d+", "thread id N", str(told.value)) == (
        "write() of batch 0 failed before its ledger mark (which this check loses on "
        "purpose, after the write): SinkWriteError(\"sink 'under_test', batch 0: "
        "ProgrammingError: SQLite objects created in a thread can only be used in that same "
        'thread. The object was created in thread id N and this is thread id N.") (the kit '
        "wrote this batch on a thread of its own, not the one that ran open(), as a FanOut of "
        "several sinks writes each sink: where the sink's error is its client refusing "
        "another thread, test_write_runs_on_another_thread_than_open says what to do)"
    )


def test_a_holds_batch_checking_its_target_passes_the_deleted_target_check(
    spark: Any, tmp_path: Path
) -> None:
    suite, case = _suite_and_case("holds_by_token", tmp_path)
    case.drop = functools.partial(shutil.rmtree, tmp_path / "out")
    suite.test_holds_batch_of_a_deleted_target_is_false(spark, case, tmp_path)
    assert not (tmp_path / "out").exists()


def test_a_read_only_check_that_creates_nothing_passes(spark: Any, tmp_path: Path) -> None:
    suite, case = _suite_and_case("checks_read_only", tmp_path)
    suite.test_a_read_only_check_creates_nothing(spark, case, tmp_path)
    assert case.ids() == [1]  # the batch written between the two read-only opens


def test_standing_problems_read_only_of_a_healthy_target_pass(spark: Any, tmp_path: Path) -> None:
    suite, case = _suite_and_case("problems_read_only", tmp_path)
    suite.test_standing_problems_of_a_healthy_target_are_none(spark, case, tmp_path)
    assert case.ids() == [1]  # the batch written between the two asks


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        # the kit asked secret_values only through a failing FanOut, which asks it again
        # after the failed open(): a sink learning its secret in open() passed, and fanout
        # validate (which masks with it before opening) printed the secret its open() quoted
        (
            "secret_learnt_at_open",
            "does not hold the secret of failing_config (it returned 0 value(s)): fanout asks "
            "it before open() (a FanOut registers its sinks' secrets before opening them, "
            "fanout validate and fanout recover --config before they open it, fanout status "
            "--config without opening it), so a secret it learns in open() goes unmasked "
            "there: take it from the options the constructor stores",
        ),
        # ... and one returning its secret as a string was told to declare it, which it did
        (
            "secret_as_text",
            "returned a string (12 characters), not a list of them: fanout masks each item, "
            "here each character alone; return [value]",
        ),
    ],
)
def test_the_secret_values_check_fails_a_secret_not_named_before_open(
    spark: Any, tmp_path: Path, kind: str, said: str
) -> None:
    suite, case = _secret_case(kind, tmp_path)
    with pytest.raises(pytest.fail.Exception) as failed:
        suite.test_secret_values_name_the_secret_before_open(spark, case, tmp_path)
    assert str(failed.value) == (
        f"secret_values() of a sink built from failing_config and not opened {said}"
    )


def test_a_secret_named_before_open_passes_the_secret_values_check(
    spark: Any, tmp_path: Path
) -> None:
    suite, case = _secret_case("secret_declared", tmp_path)
    suite.test_secret_values_name_the_secret_before_open(spark, case, tmp_path)
    assert not (tmp_path / "out").exists()  # built only, never opened


def test_a_fence_lifted_as_it_says_passes_and_the_batch_lands_once(
    spark: Any, tmp_path: Path
) -> None:
    suite, case = _suite_and_case("fenced_by_file", tmp_path)
    suite.test_lift_epoch_fence_opens_the_fenced_epoch_again(spark, case, tmp_path)
    assert case.ids() == [0, 1, 2, 3, 4, 5]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"{suite.pipeline}~under_test~000000000000.jsonl",
        f"{suite.pipeline}~under_test~000000000001.jsonl",
    ]


def test_the_lift_check_is_skipped_for_a_sink_without_it(spark: Any, tmp_path: Path) -> None:
    suite, case = _suite_and_case("token_files", tmp_path)
    with pytest.raises(pytest.skip.Exception, match="does not implement lift_epoch_fence"):
        suite.test_lift_epoch_fence_opens_the_fenced_epoch_again(spark, case, tmp_path)
    assert case.ids() == []


def test_the_new_epoch_check_passes_a_sink_keyed_by_its_idempotency_token(
    spark: Any, tmp_path: Path
) -> None:
    suite, case = _suite_and_case("token_files", tmp_path)
    suite.test_a_new_epoch_writes_beside_the_old_one(spark, case, tmp_path)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"{suite.pipeline}@e1~under_test~000000000000.jsonl",
        f"{suite.pipeline}~under_test~000000000000.jsonl",
    ]


def test_a_wrong_row_count_fails_naming_it(spark: Any, tmp_path: Path) -> None:
    catch = Catch("counts_one_too_few", SinkConformance.test_replay_of_a_marked_batch_is_skipped)
    assert re.match(
        r"write\(\) returned rows=4 for a batch of 5 rows: it must count the rows the batch "
        r"holds for it \(written now, or found already written\), 5 here",
        catch.failure(spark, tmp_path),
    )


def test_a_sink_refusing_a_new_column_said_to_write_it_is_told_how_to_say_so(
    spark: Any, tmp_path: Path
) -> None:
    catch = Catch("token_files", SinkConformance.test_schema_drift, raises=pytest.fail.Exception)
    config = {"type": "token_files", "directory": str(tmp_path / "out"), "columns": ["id", "v"]}
    message = catch.failure(spark, tmp_path, schema_drift="writes", config=config)
    assert message.startswith(
        "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink "
        "refused it: SchemaMismatchError(\"sink 'under_test', batch 1: column 'extra' is not "
        'one of id, v")'
    )
    assert message.endswith("; say SinkUnderTest(schema_drift='refuses') if it refuses new columns")


def test_the_target_replaced_check_is_skipped_for_a_sink_without_it(
    spark: Any, tmp_path: Path
) -> None:
    suite, case = _suite_and_case("token_files", tmp_path)
    with pytest.raises(pytest.skip.Exception, match="does not implement target_replaced"):
        suite.test_target_replaced_tells_a_target_created_again_empty(spark, case, tmp_path)


def test_a_harmless_rewrite_and_deterministic_columns_pass_an_upsert_by_id(
    spark: Any, tmp_path: Path
) -> None:
    suite, case = _suite_and_case("upsert_file", tmp_path)
    suite.test_a_harmless_rewrite_leaves_the_target_as_one_write(spark, case, tmp_path)
    assert sorted(r["id"] for r in read_rows(tmp_path / "out")) == [0, 1, 2, 3]
    suite.test_deterministic_columns_are_columns_of_the_batch(spark, case, tmp_path)


def test_a_secret_declared_by_secret_values_passes_the_check(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    suite, case = _secret_case("secret_declared", tmp_path)
    suite.test_a_secret_never_appears_in_errors_or_logs(spark, case, tmp_path, caplog)


def test_a_declared_secret_the_sink_logs_is_masked_as_in_a_real_run(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A real run's log handler masks a secret the sink declares, which the FanOut
    registered before opening it: the check read ``caplog`` unmasked and told the sink to
    declare the secret it declares."""
    suite, case = _secret_case("secret_logged", tmp_path)
    suite.test_a_secret_never_appears_in_errors_or_logs(spark, case, tmp_path, caplog)


def test_a_declared_secret_logged_before_the_fanout_knows_it_is_told_so(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Logged in the sink's constructor, before the FanOut registers its sinks' secrets,
    the secret is in a real run's log: the check fails, saying so, not "declare it"."""
    catch = Catch(
        "secret_logged_early",
        SinkConformance.test_a_secret_never_appears_in_errors_or_logs,
        secret=True,
    )
    said = re.sub(r"\.py:\d+ ", ".py:LINE ", catch.failure(spark, tmp_path, caplog).splitlines()[0])
    assert said == (
        "the secret of failing_config appears in the log: 'WARNING  fanout.kit_flawed:"
        "kit_flawed_sinks.py:LINE built with token <secret>'. The sink declares it "
        "(secret_values()), but logged it before fanout knew it (in its constructor, "
        "before the FanOut registers its sinks' secrets), or spelled so that fanout's "
        "masking does not find it: do not log it"
    )


def test_a_null_key_handed_to_the_dead_letter_target_passes_with_its_replay(
    spark: Any, tmp_path: Path
) -> None:
    """A sink committing the other rows and handing the null key's row over (again on a
    replay whose mark was lost: the target keeps it once) passes."""
    suite, case = _suite_and_case("null_key_dead_lettered", tmp_path)
    case.keyed, case.dead_letter = True, str(tmp_path / "dead")
    suite.test_a_null_key_is_refused_by_name_or_dead_lettered(spark, case, tmp_path)
    assert case.ids() == [1, 2]
    letters = suite._dead_letters(case)
    assert [(json.loads(d["row"]), d["source"], d["reason"]) for d in letters] == [
        ({"id": None, "v": "no key"}, "refused", "refused")
    ]


def test_the_kill_check_imports_a_plugin_from_where_the_test_imported_it(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin module a ``conftest.py`` put on ``sys.path`` (not installed, no ``env``): the
    kill check's driver failed to import it (``ModuleNotFoundError`` in a subprocess's
    traceback); it now gets the directory the module came from, behind the standard library
    and ahead of site-packages: a ``json.py`` in that directory (a test folder's module
    named like a stdlib one) crashed the driver when the directory led its PYTHONPATH."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "json.py").write_text('raise ImportError("the test folder\'s json.py")\n')
    (src / "kit_tmp_only_plugin.py").write_text(
        "from fanout import hookimpl\n"
        "from tests.integration.kit_flawed_sinks import TokenFiles\n\n\n"
        "@hookimpl\n"
        "def fanout_sink_types():\n"
        '    return {"tmp_token_files": TokenFiles}\n'
    )
    monkeypatch.syspath_prepend(str(src))
    suite, case = _suite_and_case("tmp_token_files", tmp_path)
    case.plugins = ["kit_tmp_only_plugin"]
    suite.test_kill_between_write_and_mark(spark, case, tmp_path)
    assert case.ids() == list(range(8))
