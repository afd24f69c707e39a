"""The route a partitioned sink records with each committed partition and the kit's
comparison of it on a replay (fanout.partitioned.replay_route; no Spark)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fanout import RouteError
from fanout.partitioned.membership import CommittedPartition
from fanout.partitioned.replay_route import SKIPS, check_routes, recorded_routes, route_mark
from fanout.routes.route import Route
from fanout.testing import make_batch

UTC = (("spark.sql.ansi.enabled", "true"), ("spark.sql.session.timeZone", "UTC"))
OLD = Route(where="id > 0")
NEW = Route(where="CAST(v AS INT) > 0")
IDENTITY = Route().stamp()


def test_a_stamp_accepts_its_own_fingerprint_an_earlier_one_and_an_unrecorded_route() -> None:
    stamp = OLD.stamp(UTC)
    assert stamp.mark == f"{stamp.fingerprint} where 'id > 0' under {UTC[0][0]}=true, " + (
        "spark.sql.session.timeZone=UTC"
    )
    assert stamp.accepts(stamp.mark)
    assert stamp.accepts(stamp.fingerprint)  # a bare fingerprint
    assert stamp.accepts(f"{OLD.expression_fingerprint} where 'id > 0'")  # an older fanout's
    assert stamp.accepts(OLD.stamp().mark)  # the same expressions without the settings
    assert stamp.accepts(None) and stamp.accepts("")  # not recorded: cannot be told
    assert not stamp.accepts(NEW.stamp(UTC).mark)
    assert not stamp.accepts(OLD.stamp((("spark.sql.ansi.enabled", "false"),)).mark)
    assert not stamp.accepts(f"{stamp.fingerprint[:-1]}x {stamp.text}")


def test_a_batch_outside_fanout_records_the_identity() -> None:
    batch = make_batch([{"id": 1}])
    assert route_mark(batch) == Route().stamp().mark == f"{Route().stamp().fingerprint} no route"
    routed = replace(batch, route=NEW.stamp(UTC))
    assert route_mark(routed) == NEW.stamp(UTC).mark


def test_partitions_of_the_batchs_route_or_of_none_pass() -> None:
    batch = replace(make_batch([{"id": 1}], batch_id=7), route=NEW.stamp(UTC))
    committed = [
        CommittedPartition(0, 3, "abcd1234", route=NEW.stamp(UTC).mark),
        CommittedPartition(1, 3, "abcd1234", route=NEW.stamp().mark),  # earlier
        CommittedPartition(2, 3, "abcd1234"),  # an older mark: no route recorded
    ]
    check_routes(recorded_routes(committed), batch, sink="files")
    check_routes({}, batch, sink="files")


def test_partitions_of_another_route_are_refused_naming_them_and_both_routes() -> None:
    batch = replace(make_batch([{"id": 1}], batch_id=7), route=NEW.stamp())
    committed = [
        CommittedPartition(2, 3, route=Route().stamp().mark),
        CommittedPartition(0, 3, route=Route().stamp().mark),
        CommittedPartition(1, 3, route=NEW.stamp().mark),
    ]
    assert recorded_routes(committed) == {2: IDENTITY.mark, 0: IDENTITY.mark, 1: NEW.stamp().mark}
    with pytest.raises(RouteError) as refused:
        check_routes(recorded_routes(committed), batch, sink="files")
    assert str(refused.value) == (
        "sink 'files', batch 7: the route changed mid-batch: partition(s) [0, 2] committed "
        f"this batch under no route (fingerprint {IDENTITY.fingerprint}), but the sink's "
        f"route is now where 'CAST(v AS INT) > 0' (fingerprint {NEW.stamp().fingerprint}). "
        "A replay skips the committed partitions, so a row only the new route refuses would "
        "be both in a committed partition and in the dead letters, and one only the old "
        "route refuses in neither. Nothing was written. Restore the old route (its "
        "expressions and the Spark settings it names) until this batch completes, then "
        "change it (a change between batches is safe)"
    )
    assert (refused.value.sink, refused.value.batch_id) == ("files", 7)


def test_several_other_routes_are_each_named() -> None:
    batch = make_batch([{"id": 1}], batch_id=3)  # outside fanout: the identity
    committed = [
        CommittedPartition(0, route=OLD.stamp().mark),
        CommittedPartition(1, route="0123456789abcde"),  # a fingerprint alone
        CommittedPartition(2, route=Route().stamp().mark),
    ]
    with pytest.raises(RouteError) as refused:
        check_routes(recorded_routes(committed), batch, sink="files")
    assert refused.value.detail == (
        "the route changed mid-batch: partition(s) [0] committed this batch under where "
        f"'id > 0' (fingerprint {OLD.stamp().fingerprint}), partition(s) [1] under another "
        "route (fingerprint 0123456789abcde), but the sink's route is now no route "
        f"(fingerprint {IDENTITY.fingerprint}). {SKIPS} Nothing was written. Restore the old "
        "route (its expressions and the Spark settings it names) until this batch "
        "completes, then change it (a change between batches is safe)"
    )


def test_a_sinks_own_records_and_reason_are_refused_in_the_same_words() -> None:
    """A sink that skips nothing but records its route per partition (PostgreSQL upsert)
    hands its records as a mapping and says why in its own sentence."""
    batch = replace(make_batch([{"id": 1}], batch_id=4, sink_name="pg"), route=NEW.stamp(UTC))
    routes = {1: OLD.stamp(UTC).mark, 0: None, 2: NEW.stamp(UTC).mark}
    with pytest.raises(RouteError) as refused:
        check_routes(routes, batch, sink="pg", why="An upsert deletes nothing.")
    old, new = OLD.stamp(UTC), NEW.stamp(UTC)
    assert str(refused.value) == (
        f"sink 'pg', batch 4: the route changed mid-batch: partition(s) [1] committed this "
        f"batch under {old.text} (fingerprint {old.fingerprint}), but the sink's route is "
        f"now {new.text} (fingerprint {new.fingerprint}). An upsert deletes nothing. "
        "Nothing was written. Restore the old route (its expressions and the Spark settings "
        "it names) until this batch completes, then change it (a change between batches is "
        "safe)"
    )


def test_a_batch_outside_fanout_is_compared_as_the_identity() -> None:
    """A batch handed no route records the identity's mark, which passes against itself
    and against marks that recorded nothing, and refuses another route."""
    batch = make_batch([{"id": 1}], batch_id=2)
    check_routes({0: route_mark(batch), 1: None, 2: ""}, batch, sink="files")
    with pytest.raises(RouteError, match=r"partition\(s\) \[3\] committed this batch under where"):
        check_routes({0: route_mark(batch), 3: OLD.stamp().mark}, batch, sink="files")
