"""Sink option values are checked against the sink constructor's annotations where the
sink is configured (``FanOut(...)``, a pipeline file, ``fanout validate``), before the
stream starts, naming the sink, the option, the value and the type expected."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pytest

from fanout import FanOut, Sink
from fanout.app.cli import main
from fanout.app.config import parse
from fanout.app.runner import sink_option_names
from fanout.contract.options import (
    coerce_option_text,
    option_types,
    type_text,
    value_fits,
)
from fanout.errors import ConfigurationError
from fanout.hooks.registry import load_registry
from fanout.observe.option_values import option_type_problems
from tests.unit.test_registry import entry_point

if TYPE_CHECKING:
    from decimal import Decimal  # not importable at run time from this module's globals


class BatchedSink(Sink):
    guarantees: ClassVar = ("idempotent",)

    def __init__(
        self,
        name: str,
        *,
        batch_size: int = 100,
        limit: int | None = None,
        ratio: float = 0.5,
        verbose: bool = False,
        mode: Literal["append", "merge"] = "append",
        keys: Sequence[str] | None = None,
        settings: Mapping[str, str] | None = None,
        anything=None,  # type: ignore[no-untyped-def]
        price: Decimal | None = None,
    ) -> None:
        super().__init__(name)
        self.batch_size = batch_size

    def write(self, batch: Any) -> int:
        return 0


FITS: list[tuple[object, Any, bool]] = [
    (100, int, True),
    ("100", int, False),
    (True, int, False),
    (1.5, int, False),
    (2, float, True),
    (2.5, float, True),
    (False, float, False),
    (True, bool, True),
    (1, bool, False),
    (None, int | None, True),
    (3, int | None, True),
    ("x", int | None, False),
    ("merge", Literal["append", "merge"], True),
    ("upsert", Literal["append", "merge"], False),
    (["a", "b"], Sequence[str], True),
    ("a", Sequence[str], True),
    (["a", 1], Sequence[str], False),
    ({"a": "b"}, Mapping[str, str], True),
    ({"a": 1}, Mapping[str, str], False),
    (["a"], Mapping[str, str], False),
    (Path("/d"), str, False),
    (["a", "b"], tuple[str, ...], True),  # a pipeline file's array
    (("a", 1), tuple[str, int], True),
    (["a", 1], tuple[str, int], True),
    (["a"], tuple[str, int], False),
    (("a",), list[str], True),
    ("ab", list[str], False),
]


@pytest.mark.parametrize(("value", "hint", "fits"), FITS)
def test_a_value_fits_its_annotation(value: object, hint: Any, fits: bool) -> None:
    assert value_fits(value, hint) is fits


def test_the_types_come_from_the_constructor_and_unresolved_ones_are_not_checked() -> None:
    hints = option_types(BatchedSink)
    assert type_text(hints["batch_size"]) == "int"
    assert type_text(hints["limit"]) == "int or none"
    assert type_text(hints["mode"]) == "one of 'append', 'merge'"
    assert type_text(hints["keys"]) == "a list of str or none"
    assert type_text(hints["settings"]) == "a mapping of str to str or none"
    assert hints["anything"] is Any  # unannotated
    assert hints["price"] is Any  # `Decimal` is imported under TYPE_CHECKING only
    assert option_type_problems(BatchedSink, {"anything": object(), "price": "x"}) == []


def test_each_wrong_value_is_named_with_the_type_expected() -> None:
    options = {"batch_size": "abc", "verbose": 1, "ratio": 1, "mode": "upsert", "nope": 1}
    assert option_type_problems(BatchedSink, options) == [
        "option 'batch_size': expected int, got 'abc' (str)",
        "option 'verbose': expected bool, got 1 (int)",
        "option 'mode': expected one of 'append', 'merge', got 'upsert' (str)",
    ]


def test_a_number_that_is_not_finite_is_named() -> None:
    """``"nan"`` from a pipeline file is made a float, which fits ``float``: a Delta
    retention of nan then failed in ``timedelta`` with neither sink nor option named."""
    options = coerce_option_text(BatchedSink, {"ratio": "nan", "limit": 3, "anything": "inf"})
    assert option_type_problems(BatchedSink, {**options, "batch_size": float("inf")}) == [
        "option 'ratio': expected a finite number, got nan (float)",
        "option 'batch_size': expected int, got inf (float)",
    ]
    assert option_type_problems(BatchedSink, {"ratio": -0.5}) == []  # the sign: the sink's


def test_numbers_written_as_text_are_made_numbers_only_where_a_number_is_taken() -> None:
    options = {"batch_size": "100", "ratio": "0.25", "limit": " 7 ", "mode": "5", "keys": "1"}
    assert coerce_option_text(BatchedSink, options) == {
        "batch_size": 100, "ratio": 0.25, "limit": 7, "mode": "5", "keys": "1",
    }  # fmt: skip
    assert coerce_option_text(BatchedSink, {"batch_size": "1.5"}) == {"batch_size": "1.5"}


@pytest.fixture
def registry() -> Any:
    return load_registry(entry_points_=[entry_point("batched", {"batched": BatchedSink})])


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("batch_size", "abc", "option 'batch_size': expected int, got 'abc' (str)"),
        ("batch_size", True, "option 'batch_size': expected int, got True (bool)"),
        ("keys", ["id", 2], "option 'keys': expected a list of str or none, got ['id', 2] (list)"),
    ],
)
def test_a_dict_sink_with_a_wrong_value_is_refused_before_it_is_built(
    registry: Any, option: str, value: object, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        registry.build_sink(
            {"type": "batched", "name": "out", option: value}, registry.sink_types()
        )
    assert str(refused.value) == (
        f"sink 'out' (type 'batched'): {problem}; fix the value in the sink's configuration "
        "(`fanout plugins --options batched` describes each option)"
    )


def test_a_dict_sink_with_right_values_is_built(registry: Any) -> None:
    spec = {"type": "batched", "name": "out", "batch_size": 5, "ratio": 1, "keys": "id"}
    sink = registry.build_sink(spec, registry.sink_types())
    assert (type(sink), sink.name, sink.batch_size) == (BatchedSink, "out", 5)


def test_fanout_refuses_a_wrong_value_of_a_built_in_sink(tmp_path: Path) -> None:
    sink = {"type": "delta", "name": "d", "path": str(tmp_path / "d"), "compact_every": True}
    with pytest.raises(ConfigurationError) as refused:
        FanOut(pipeline="p", ledger=str(tmp_path / "ledger"), sinks=[sink])
    assert str(refused.value) == (
        "sink 'd' (type 'delta'): option 'compact_every': expected int or none, got True "
        "(bool); fix the value in the sink's configuration (`fanout plugins --options delta` "
        "describes each option)"
    )


def _pipeline(tmp_path: Path, sink_lines: str) -> Path:
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/l"\ncheckpoint = "{tmp_path}/c"\n'
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "d"\n'
        f'path = "{tmp_path}/d"\n{sink_lines}'
    )
    return file


def test_validate_refuses_a_pipeline_file_with_a_wrong_option_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = _pipeline(tmp_path, 'compact_every = "often"\n')
    assert main(["validate", str(file)]) == 2
    assert capsys.readouterr().err.strip() == (
        "fanout: configuration error: sinks[0] (sink 'd', type 'delta'): option "
        "'compact_every': expected int or none, got 'often' (str); "
        "`fanout plugins --options delta` describes each option"
    )


def test_a_pipeline_file_number_from_the_environment_is_made_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fanout_delta.sink import DeltaSink

    monkeypatch.setenv("FANOUT_TEST_COMPACT", "10")
    doc = {
        "pipeline": {"name": "p", "ledger": "/l", "checkpoint": "/c"},
        "source": {"format": "rate"},
        "sinks": [{"type": "delta", "name": "d", "path": "/d",
                   "compact_every": "${FANOUT_TEST_COMPACT}", "where": "x > 1"}],
    }  # fmt: skip
    config = parse(doc, sink_option_names(), sink_classes={"delta": DeltaSink})
    assert config.sinks == [
        {"type": "delta", "name": "d", "path": "/d", "compact_every": 10, "where": "x > 1"}
    ]


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


def test_a_wrong_value_beside_a_secret_does_not_print_the_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``storage_options = { AWS_SECRET_ACCESS_KEY = "${...}", AWS_REGIONS = [...] }``: the
    list is refused, naming the entry, not the mapping's secret, in the pipeline file's
    check and in FanOut's."""
    monkeypatch.setenv("FANOUT_TEST_SECRET", SECRET)
    file = _pipeline(
        tmp_path,
        'storage_options = { AWS_SECRET_ACCESS_KEY = "${FANOUT_TEST_SECRET}", '
        'AWS_REGION = ["eu-west-1"] }\n',
    )
    expected = (
        "option 'storage_options': expected a mapping of str to (str or int or float or bool) "
        "or none, got {'AWS_SECRET_ACCESS_KEY': '***', 'AWS_REGION': ['eu-west-1']} (dict)"
    )
    assert main(["validate", str(file)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"fanout: configuration error: sinks[0] (sink 'd', type 'delta'): {expected}; "
        "`fanout plugins --options delta` describes each option"
    )
    options = {"AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": ["eu-west-1"]}
    sink = {"type": "delta", "name": "d", "path": str(tmp_path / "d"), "storage_options": options}
    with pytest.raises(ConfigurationError) as refused:
        FanOut(pipeline="p", ledger=str(tmp_path / "ledger"), sinks=[sink])
    assert str(refused.value) == (
        f"sink 'd' (type 'delta'): {expected}; fix the value in the sink's configuration "
        "(`fanout plugins --options delta` describes each option)"
    )


def test_delta_numbers_and_booleans_in_storage_options_and_configuration_are_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``AWS_ALLOW_HTTP = true`` in a pipeline file was refused (delta-rs takes only
    text): the Delta sink takes it and hands delta-rs ``"true"``, a number as its text."""
    from fanout_delta.sink import DeltaSink

    file = _pipeline(
        tmp_path,
        "storage_options = { AWS_ALLOW_HTTP = true, AWS_MAX_RETRIES = 3, TIMEOUT_S = 2.5 }\n"
        'configuration = { "delta.appendOnly" = false, "delta.checkpointInterval" = 20 }\n',
    )
    assert main(["validate", str(file)]) == 0
    capsys.readouterr()
    options = {"AWS_ALLOW_HTTP": True, "AWS_MAX_RETRIES": 3, "TIMEOUT_S": 2.5, "REGION": "x"}
    configuration = {"delta.appendOnly": False, "delta.checkpointInterval": 20, "k": None}
    sink = {"type": "delta", "name": "d", "path": str(tmp_path / "d"),
            "storage_options": options, "configuration": configuration}  # fmt: skip
    fanout = FanOut(pipeline="p", ledger=str(tmp_path / "ledger"), sinks=[sink])
    built = fanout.specs["d"].sink
    assert isinstance(built, DeltaSink)
    assert built.storage_options == {
        "AWS_ALLOW_HTTP": "true", "AWS_MAX_RETRIES": "3", "TIMEOUT_S": "2.5", "REGION": "x"
    }  # fmt: skip
    assert built.configuration == {
        "delta.appendOnly": "false", "delta.checkpointInterval": "20", "k": None
    }  # fmt: skip
