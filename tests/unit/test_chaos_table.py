"""The long chaos run's per-sink table: columns line up whatever the sinks' labels."""

from __future__ import annotations

from tests.chaos.checker import SinkCheck
from tests.chaos.harness import ChaosReport


def test_a_label_longer_than_the_header_keeps_the_columns_aligned() -> None:
    report = ChaosReport(
        seed=1,
        checks=[
            SinkCheck("lake (delta)", 250000, 250000, 0, 0),
            SinkCheck("bus (kafka) log markers", 250000, 249999, 1, 0),
        ],
    )
    assert report.table().splitlines() == [
        "sink                       expected   present   missing  duplicated   wrong",
        "lake (delta)                 250000    250000         0           0       0",
        "bus (kafka) log markers      250000    249999         1           0       0",
    ]
