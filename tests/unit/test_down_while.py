"""``fanout.testing.faults.DownWhile``, the "target down while ``down`` holds" mixin the
suite's lagging-sink tests (and plugin authors') put before a sink type."""

from __future__ import annotations

import pytest

from fanout.errors import SinkWriteError, TransientSinkError
from fanout.testing import RecordingSink, make_batch
from fanout.testing.faults import DownWhile


class _Down(DownWhile, RecordingSink):
    down_message = "the disk is gone"


def test_writes_fail_finally_while_down_and_go_through_once_up() -> None:
    sink = _Down("copy")
    with pytest.raises(SinkWriteError) as caught:
        sink.write(make_batch([{"id": 1}], batch_id=3, sink_name="copy"))
    assert not isinstance(caught.value, TransientSinkError)
    assert (caught.value.sink, caught.value.batch_id) == ("copy", 3)
    assert str(caught.value) == "sink 'copy', batch 3: the disk is gone"
    assert sink.calls == [] and sink.batches == {}
    sink.down = False
    assert sink.write(make_batch([{"id": 1}, {"id": 2}], batch_id=4, sink_name="copy")).rows == 2
    assert sink.batches == {4: [{"id": 1}, {"id": 2}]}
    assert _Down("other").down and DownWhile.down  # each instance starts down
