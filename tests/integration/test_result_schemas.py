"""fanout builds its ``mapInArrow`` result schemas in Python (no py4j round trips before
each job): each must be exactly what Spark makes of the same DDL text."""

from __future__ import annotations

from typing import Any

import pytest

from fanout.contract.sessions import result_schema
from fanout.delta_tables.datafiles import FILE_ROW_DDL
from fanout.partitioned.outcome import RESULT_DDL
from fanout.partitioned.shared import SHARED_RESULT_DDL


@pytest.mark.parametrize("ddl", [RESULT_DDL, SHARED_RESULT_DDL, FILE_ROW_DDL])
def test_a_result_schema_is_what_spark_parses_from_its_ddl(spark: Any, ddl: str) -> None:
    from pyspark.sql.types import _parse_datatype_string

    assert result_schema(ddl) == _parse_datatype_string(ddl)
    assert [f.name for f in result_schema(ddl).fields] == [f.split()[0] for f in ddl.split(",")]
