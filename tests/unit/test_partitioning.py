"""The partition plan, its fingerprint, the per-partition digest and the driver's
comparison with what committed partitions recorded (no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from fanout_kafka.membership import pack, unpack

from fanout.errors import ConfigurationError, PartitioningError, SinkError
from fanout.partitioned.determinism import advice_for
from fanout.partitioned.membership import (
    MEMBER_COLUMN,
    WHOLE_ROW,
    CommittedPartition,
    MemberDigest,
    PartitionDigest,
    PartitionPlan,
    check_committed,
    check_hashable,
    unhashable,
)

PLAN = PartitionPlan(4, (("order_id", "bigint"),))
DIGESTS = {0: PartitionDigest(10, 12345), 1: PartitionDigest(7, 999), 3: PartitionDigest(3, 5)}


class Summary:
    """Stands in for the Spark job; counts its calls."""

    def __init__(self, digests: dict[int, PartitionDigest]) -> None:
        self.digests, self.calls = digests, 0

    def __call__(self) -> dict[int, PartitionDigest]:
        self.calls += 1
        return self.digests


def test_fingerprint_depends_on_columns_and_types_not_on_the_count() -> None:
    assert PLAN.fingerprint == PartitionPlan(6, PLAN.columns).fingerprint
    assert len(PLAN.fingerprint) == 8 and int(PLAN.fingerprint, 16) >= 0
    others = {
        PartitionPlan(4, (("order_id", "int"),)).fingerprint,
        PartitionPlan(4, (("customer", "bigint"),)).fingerprint,
        PartitionPlan(4, (("order_id", "bigint"), ("customer", "string"))).fingerprint,
        PartitionPlan(4, (("customer", "string"), ("order_id", "bigint"))).fingerprint,
    }
    assert PLAN.fingerprint not in others and len(others) == 4
    assert PLAN.describe() == f"4 partitions by order_id bigint (fingerprint {PLAN.fingerprint})"


def test_nothing_committed_costs_no_spark_job() -> None:
    summary = Summary(DIGESTS)
    check_committed([], PLAN, summary, sink="events", batch_id=3)
    assert summary.calls == 0


def test_same_partitions_pass_after_one_summary() -> None:
    summary = Summary(DIGESTS)
    committed = [
        CommittedPartition(0, 4, PLAN.fingerprint, DIGESTS[0]),
        CommittedPartition(3, 4, PLAN.fingerprint, short=DIGESTS[3].short()),
    ]
    check_committed(committed, PLAN, summary, sink="events", batch_id=3)
    assert summary.calls == 1


def test_changed_count_is_refused_before_any_spark_job() -> None:
    summary = Summary(DIGESTS)
    with pytest.raises(PartitioningError) as refused:
        check_committed([CommittedPartition(1, 6, PLAN.fingerprint)], PLAN, summary,
                        sink="events", batch_id=3)  # fmt: skip
    message = str(refused.value)
    assert message.startswith("sink 'events', batch 3: option 'partitions' changed mid-batch")
    assert "partition 1 committed with partitions 6, now 4" in message
    assert "Partitions [1] already hold batch 3" in message
    assert "Restore partitions=6" in message
    assert summary.calls == 0
    assert (refused.value.sink, refused.value.batch_id) == ("events", 3)


def test_changed_columns_are_refused_with_the_new_plan_named() -> None:
    with pytest.raises(PartitioningError, match="partitioning columns changed") as refused:
        check_committed([CommittedPartition(0, 4, "0badf00d")], PLAN, Summary(DIGESTS),
                        sink="events", batch_id=0)  # fmt: skip
    assert "fingerprint 0badf00d, now 4 partitions by order_id bigint" in str(refused.value)


@pytest.mark.parametrize(
    ("mark", "shown"),
    [
        (CommittedPartition(1, 4, PLAN.fingerprint, PartitionDigest(8, 999)), "committed 8 rows"),
        (CommittedPartition(1, 4, PLAN.fingerprint, PartitionDigest(7, 1000)), "committed 7 rows"),
        (
            CommittedPartition(1, 4, PLAN.fingerprint, short=PartitionDigest(7, 1).short()),
            "committed other rows",
        ),
        (CommittedPartition(2, 4, PLAN.fingerprint, PartitionDigest(1, 1)), "committed 1 rows"),
    ],
)
def test_moved_rows_are_refused_naming_the_partition(mark: CommittedPartition, shown: str) -> None:
    with pytest.raises(PartitioningError, match="rows moved between partitions") as refused:
        check_committed([mark], PLAN, Summary(DIGESTS), sink="events", batch_id=5)
    message = str(refused.value)
    assert f"partition {mark.partition} {shown}" in message
    now = DIGESTS.get(mark.partition, PartitionDigest(0, 0)).rows
    assert f"re-planned it now holds {now} rows" in message


def test_marks_without_a_plan_are_compared_by_nothing_but_do_not_fail() -> None:
    check_committed([CommittedPartition(0)], PLAN, Summary(DIGESTS), sink="s", batch_id=1)


def test_partitioning_error_is_a_sink_error_and_a_configuration_error() -> None:
    error = PartitioningError("x", sink="s", batch_id=None)
    assert isinstance(error, SinkError) and isinstance(error, ConfigurationError)
    assert str(error) == "sink 's': x"


def test_member_digest_strips_the_column_and_sums_it() -> None:
    batches = [
        pa.RecordBatch.from_pydict({"a": [1, 2], MEMBER_COLUMN: [5, 4294967295]}),
        pa.RecordBatch.from_pydict({"a": [3], MEMBER_COLUMN: [7]}),
        pa.RecordBatch.from_pydict({"a": [4]}),  # upsert batches carry no member column
    ]
    digest = MemberDigest()
    out = list(digest.strip(iter(batches)))
    assert [b.schema.names for b in out] == [["a"], ["a"], ["a"]]
    assert [b.num_rows for b in out] == [2, 1, 1]
    assert digest.digest == PartitionDigest(3, 5 + 4294967295 + 7)


def test_kafka_plan_offset_round_trip() -> None:
    digest = PartitionDigest(40, 123456789012)
    offset = pack(PLAN, digest)
    assert 0 <= offset < 2**63
    assert unpack(2, offset, PLAN) == CommittedPartition(
        2, 4, PLAN.fingerprint, short=digest.short()
    )
    other = PartitionPlan(6, (("customer", "string"),))
    seen = unpack(2, offset, other)
    assert seen.partitions == 4 and seen.fingerprint == PLAN.fingerprint[:4] + "..."
    with pytest.raises(PartitioningError, match="with partitions 4, now 6"):
        check_committed([seen], other, Summary({}), sink="events", batch_id=1)


def test_advice_names_keys_for_a_keyless_sink_and_the_columns_for_a_keyed_one() -> None:
    assert "no key" in advice_for(WHOLE_ROW) and "'key'" in advice_for(WHOLE_ROW)
    assert advice_for(["order_id"]).startswith("This sink partitions by order_id")


def test_the_columns_a_sink_needs_deterministic_default_to_its_partitioning() -> None:
    from fanout.contract.partitions import StableColumns
    from fanout.contract.sink import Sink
    from fanout.partitioned.determinism import refusal

    class Keyed(Sink):
        def partitioned_by(self) -> list[str]:
            return ["order_id"]

    assert Sink.deterministic_columns(Sink.__new__(Sink)) is None  # commits batches whole
    stable = Keyed.__new__(Keyed).deterministic_columns()
    assert stable == StableColumns(["order_id"])
    text = str(refusal("column 'order_id'", ["order_id"], "s", 1))
    assert text == str(refusal("column 'order_id'", stable, "s", 1))
    assert "would put rows in other partitions" in text
    upsert = StableColumns(["id"], "upserts by", "a replay would compute other keys")
    assert str(refusal("column 'id'", upsert, "s", 1)).startswith(
        "sink 's', batch 1: column 'id' is not deterministic: a replay would compute other "
        "keys. This sink upserts by id: derive"
    )


def test_a_map_or_variant_at_any_depth_cannot_be_hashed_into_partitions() -> None:
    """Spark refuses ``xxhash64`` over them (HASH_MAP_TYPE, HASH_VARIANT_TYPE)."""
    from pyspark.sql import types as T

    m = T.MapType(T.StringType(), T.LongType())
    schema = T.StructType([
        T.StructField("id", T.LongType()), T.StructField("m", m),
        T.StructField("s", T.StructType([T.StructField("x", T.ArrayType(m))])),
        T.StructField("v", T.VariantType()), T.StructField("a", T.ArrayType(T.LongType())),
        T.StructField("d", T.DayTimeIntervalType()),
    ])  # fmt: skip
    assert unhashable(schema, schema.fieldNames()) == [
        ("m", "map<string,bigint>"), ("s", "struct<x:array<map<string,bigint>>>"),
        ("v", "variant"),
    ]  # fmt: skip
    assert unhashable(schema, ["id", "a", "d"]) == []
    check_hashable(schema, ["id", "a"], keyed=True, sink="k", batch_id=1)
    with pytest.raises(SinkError) as refused:
        check_hashable(schema, ["id", "v"], keyed=True, sink="k", batch_id=1)
    assert str(refused.value) == (
        "sink 'k', batch 1: column(s) 'v' (variant) cannot assign rows to partitions: Spark "
        "cannot hash a map or a variant (DATATYPE_MISMATCH.HASH_MAP_TYPE or "
        "HASH_VARIANT_TYPE). This sink partitions by its key column(s) id, v: choose keys "
        "without maps or variants, or convert the column in the query or the sink's select "
        "(e.g. to_json(v))"
    )
