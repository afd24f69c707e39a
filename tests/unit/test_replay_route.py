"""The route a partitioned sink records with each committed partition and the kit's
comparison of it on a replay (fanout.partitioned.replay_route; no Spark)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fanout import RouteError
from fanout.partitioned.membership import CommittedPartition
from fanout.partitioned.replay_route import check_routes, route_mark
from fanout.routes.route import Route
from fanout.testing import make_batch

UTC = (("spark.sql.ansi.enabled", "true"), ("spark.sql.session.timeZone", "UTC"))
OLD = Route(where="id > 0")
NEW = Route(where="CAST(v AS INT) > 0")


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
    check_routes(committed, batch, sink="files")
    check_routes([], batch, sink="files")


def test_partitions_of_another_route_are_refused_naming_them_and_both_routes() -> None:
    batch = replace(make_batch([{"id": 1}], batch_id=7), route=NEW.stamp())
    committed = [
        CommittedPartition(2, 3, route=Route().stamp().mark),
        CommittedPartition(0, 3, route=Route().stamp().mark),
        CommittedPartition(1, 3, route=NEW.stamp().mark),
    ]
    with pytest.raises(RouteError) as refused:
        check_routes(committed, batch, sink="files")
    assert str(refused.value) == (
        "sink 'files', batch 7: the route changed mid-batch: partition(s) [0, 2] committed "
        "this batch under no route, but the sink's route is now where 'CAST(v AS INT) > 0'. "
        "Nothing was written. Restore the old route until this batch completes, then change "
        "it (a change between batches is safe)"
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
        check_routes(committed, batch, sink="files")
    assert refused.value.detail == (
        "the route changed mid-batch: partition(s) [0] committed this batch under where "
        "'id > 0', partition(s) [1] under another route (fingerprint 0123456789abcde), but "
        "the sink's route is now no route. Nothing was written. Restore the old route until "
        "this batch completes, then change it (a change between batches is safe)"
    )
