"""The letters journal's encoding and the replay's rebuilding of letters (pure logic)."""

from __future__ import annotations

import json

import pytest
from fanout_kafka.journal import (
    MAX_JOURNAL_BYTES,
    JournalMismatch,
    JournalTooLarge,
    decode,
    encode,
    letters_group,
    pack_refused,
    rebuild,
    record_digest,
    refused_group,
    summary,
    unpack_refused,
)
from fanout_kafka.records import BadRecord, Record

H = [("fanout.batch_id", b"7")]


def test_digests_tell_key_value_headers_and_nulls_apart() -> None:
    records = [
        Record(b"k", b"v", H),
        Record(b"k", b"v", []),
        Record(b"kv", b"", H),
        Record(None, b"v", H),
        Record(b"", b"v", H),
        Record(b"k", None, H),
    ]
    assert len({record_digest(r) for r in records}) == len(records)
    assert record_digest(Record(b"k", b"v", list(H))) == record_digest(records[0])


def test_a_journal_round_trip_rebuilds_the_letters_from_the_replays_records() -> None:
    a, b, c = Record(b"a", b"1", H), Record(b"b", b"2", H), Record(None, b"3", H)
    letters = [BadRecord(b, "too large"), BadRecord(b, "too large"), BadRecord(c, "null key")]
    value = encode(7, letters)
    data = json.loads(value)
    assert data["batch"] == 7 and data["reasons"] == ["too large", "null key"]
    entries = decode(value, 7)
    assert entries is not None and len(entries) == 3
    # the replay's encoder found c bad again; a and b (twice) are records
    rebuilt = rebuild(entries, [a, b, b], [BadRecord(c, "null key: key column(s) 'id'")])
    assert rebuilt == letters
    assert decode(value, 8) is None  # another batch's journal: this one had no letters


def test_a_journal_naming_a_record_the_replay_lacks_is_refused() -> None:
    value = encode(1, [BadRecord(Record(b"x", b"1", []), "r")])
    entries = decode(value, 1)
    assert entries is not None
    with pytest.raises(JournalMismatch, match="does not have"):
        rebuild(entries, [Record(b"y", b"1", [])], [])


def test_a_journal_too_large_is_refused_before_the_commit() -> None:
    many = [BadRecord(Record(str(i).encode(), b"", []), "r") for i in range(30_000)]
    with pytest.raises(JournalTooLarge, match="raise the sink's 'partitions'"):
        encode(1, many)
    assert len(encode(1, many[:20_000])) <= MAX_JOURNAL_BYTES


def test_the_letters_group_sits_beside_the_marker_group() -> None:
    assert letters_group("fanout/orders/events/p3") == "fanout/orders/events/p3.letters"


def test_the_refused_count_is_read_back_for_its_own_batch_only() -> None:
    assert refused_group("fanout/orders/events/p3") == "fanout/orders/events/p3.refused"
    assert unpack_refused(pack_refused(41, 7), 41) == 7
    assert unpack_refused(pack_refused(2**32 + 5, 2**31 - 1), 2**32 + 5) == 2**31 - 1
    assert unpack_refused(pack_refused(40, 7), 41) == 0  # an earlier batch's
    assert unpack_refused(-1001, 41) == 0  # none committed (librdkafka's OFFSET_INVALID)


def test_a_journal_s_summary_is_its_batch_and_letter_count() -> None:
    value = encode(
        9, [BadRecord(Record(b"k", b"v", H), "why"), BadRecord(Record(None, b"w", H), "why")]
    )
    assert summary(value) == (9, 2)
