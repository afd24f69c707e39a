"""A route Spark cannot resolve says what to do, not only Spark's complaint (no Spark:
a stand-in DataFrame raises Spark's first line as its analyzer does)."""

from __future__ import annotations

from typing import Any

import pytest

from fanout import RouteError
from fanout.routes.route import Route

SPARK_SAYS = (
    "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name "
    "`statsu` cannot be resolved. Did you mean one of the following? [`status`, `amount`]. "
    "SQLSTATE: 42703; line 1 pos 0;\n'Filter ('statsu = paid)\n+- LogicalRDD [status, amount]"
)


class _Unresolvable:
    """A DataFrame whose every ``where`` and ``selectExpr`` Spark's analyzer refuses."""

    def where(self, _expression: str) -> Any:
        raise RuntimeError(SPARK_SAYS)

    def selectExpr(self, *_expressions: str) -> Any:
        raise RuntimeError(SPARK_SAYS)


@pytest.mark.parametrize(
    ("route", "kind", "expression"),
    [
        (Route(where="statsu = 'paid'"), "where", "statsu = 'paid'"),
        (Route(select=("statsu",)), "select", "statsu"),
    ],
)
def test_an_unresolved_route_names_the_sink_batch_expression_and_the_fix(
    route: Route, kind: str, expression: str
) -> None:
    """It ended at Spark's "line 1 pos 0;", leaving the newcomer to infer which option of
    which file to change."""
    with pytest.raises(RouteError) as caught:
        route.resolve(_Unresolvable(), sink="paid", batch_id=4)
    assert str(caught.value) == (
        f"sink 'paid', batch 4: route {kind} {expression!r} cannot be applied to the batch: "
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with "
        "name `statsu` cannot be resolved. Did you mean one of the following? [`status`, "
        f"`amount`]. SQLSTATE: 42703; line 1 pos 0; fix the sink's '{kind}' against the "
        "batch's columns, or add to the stream what it names"
    )
