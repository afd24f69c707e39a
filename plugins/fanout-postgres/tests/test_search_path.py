"""A ``search_path`` set for the sink, in option ``settings`` (the write connections' only)
or in the URL's ``options`` (every connection's): the target and the ``postgres:``
dead-letter table, named without a schema, are resolved once, on the driver, by the URL's
search path, and every partition writes there, qualified. Before, the dead-letter table
was not qualified: created by the driver in ``public``, looked up by the partitions under
``settings``' search path, where it did not exist, and every partition holding a refused
row failed at every attempt (``relation "rejects" does not exist``), the pipeline stuck."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchInfo, FanOut

pytestmark = pytest.mark.integration


def _tables(url: str) -> None:
    execute(
        url,
        "CREATE SCHEMA app",
        "CREATE TABLE app.t1 (id bigint PRIMARY KEY, v int CHECK (v >= 0))",
        "CREATE TABLE public.t1 (id bigint PRIMARY KEY, v int CHECK (v >= 0))",
    )


def _run(spark: Any, url: str, tmp_path: Path, mode: str, **options: Any) -> Any:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "t1", "mode": mode,
            "keys": ["id"], "partitions": 2, "dead_letter": "postgres:rejects",
            **options}  # fmt: skip
    fan = FanOut("sp", str(tmp_path / "ledger"), [sink], retries=0)
    rows = spark.range(0, 6).selectExpr("id", "CAST(IF(id IN (2, 5), -1, id) AS INT) AS v")
    try:
        return fan.process(rows, BatchInfo("sp", 0, "q"))["pg"]
    finally:
        fan.close()


def _ids(url: str, table: str) -> list[int]:
    return [row[0] for row in query(url, f"SELECT id FROM {table} ORDER BY id")]


def _letters(url: str, table: str) -> list[int]:
    return [row[0] for row in query(url, f"SELECT (row->>'id')::int FROM {table} ORDER BY 1")]


def _schemas_of(url: str, name: str) -> list[str]:
    return [row[0] for row in query(url, "SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                                         "ON n.oid = c.relnamespace WHERE c.relname = %s "
                                         "ORDER BY 1", (name,))]  # fmt: skip


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_search_path_in_settings_writes_where_the_driver_resolved(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    """``settings: {search_path: app}``, ``app.t1`` and ``public.t1`` both there: the rows
    go to ``public.t1`` (the URL's search path, as the driver planned), the refused ids
    2 and 5 to ``public.rejects``, once each; ``app`` gets nothing."""
    _tables(pg_url)
    result = _run(spark, pg_url, tmp_path, mode, settings={"search_path": "app"})
    assert (result.rows, result.dead_lettered) == (4, 2)
    assert _ids(pg_url, "public.t1") == [0, 1, 3, 4]
    assert _ids(pg_url, "app.t1") == []
    assert _schemas_of(pg_url, "rejects") == ["public"]
    assert _letters(pg_url, "public.rejects") == [2, 5]


def test_a_search_path_in_the_url_resolves_every_name_there(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The URL's ``options=-csearch_path=app``: the driver and the partitions alike read
    it, so the rows go to ``app.t1`` and the refused ones to ``app.rejects``, which the
    sink created there."""
    _tables(pg_url)
    url = pg_url + ("&" if "?" in pg_url else "?") + "options=-csearch_path%3Dapp"
    result = _run(spark, url, tmp_path, "append")
    assert (result.rows, result.dead_lettered) == (4, 2)
    assert _ids(pg_url, "app.t1") == [0, 1, 3, 4]
    assert _ids(pg_url, "public.t1") == []
    assert _schemas_of(pg_url, "rejects") == ["app"]
    assert _letters(pg_url, "app.rejects") == [2, 5]


def test_a_search_path_switched_after_a_clean_stop_names_the_table_written_to(
    spark: Any, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Batch 0 written and marked into ``app.t1`` through the URL's ``search_path=app``;
    the next run's URL has none, so ``t1`` is ``public.t1``, empty: the start refuses it
    as a table created again (``TargetLostError``), and now says the search path may have
    changed and which table batch 0 went to (before: only "renamed away, or dropped, and
    another created", whose way on, accepting, writes on into ``public.t1``). Its way on,
    option ``table`` set to ``app.t1``, writes batch 1 there: each id once. With rows in
    ``public.t1`` the run is not refused (a dump restored, as ever) and says where it
    writes now."""
    from fanout import TargetLostError

    execute(pg_url, "CREATE SCHEMA app", "CREATE TABLE app.t1 (id bigint)",
            "CREATE TABLE public.t1 (id bigint)")  # fmt: skip
    ledger = str(tmp_path / "ledger")

    def fan(url: str, **options: Any) -> FanOut:
        sink = {"type": "postgres", "name": "pg", "url": url, "table": "t1",
                "mode": "append", "partitions": 2, **options}  # fmt: skip
        return FanOut("sp", ledger, [sink], retries=0)

    def run(f: FanOut, batch: int) -> Any:
        try:
            return f.process(spark.range(4 * batch, 4 * batch + 4), BatchInfo("sp", batch, "q"))
        finally:
            f.close()

    app = pg_url + ("&" if "?" in pg_url else "?") + "options=-csearch_path%3Dapp"
    run(fan(app), 0)
    with pytest.raises(TargetLostError) as lost:
        run(fan(pg_url), 1)
    assert (
        "or the search path changed (the URL's options, or the role's or database's "
        "search_path): the table written to is app.t1, still there; set the search path "
        "back, or option table to it, and restart" in str(lost.value)
    ), str(lost.value)
    run(fan(pg_url, table="app.t1"), 1)
    assert (_ids(pg_url, "app.t1"), _ids(pg_url, "public.t1")) == (list(range(8)), [])

    execute(pg_url, "INSERT INTO public.t1 VALUES (100)")
    run(fan(pg_url), 2)
    assert "the name t1 resolves to another table than then" in caplog.text
    assert (_ids(pg_url, "app.t1"), _ids(pg_url, "public.t1")) == (
        list(range(8)),
        [8, 9, 10, 11, 100],
    )


def test_a_quoted_schema_switched_mid_batch_its_printed_table_completes_the_batch(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1's partition 0 committed into ``"MyApp"."T 1"`` (the URL's search path),
    partition 1 aborted; the replay's URL has no search path and ``public."T 1"`` holds a
    row of its own. The replay is refused naming the table written to, quoted; its option
    ``table`` set to the name exactly as printed completes the batch there: ids 4-7 once
    in ``"MyApp"."T 1"``, ``public."T 1"`` keeps only its own row 100."""
    from fanout import BatchFailedError
    from fanout.testing.faults import VetoOnce

    execute(pg_url, 'CREATE SCHEMA "MyApp"', 'CREATE TABLE "MyApp"."T 1" (id bigint)',
            'CREATE TABLE public."T 1" (id bigint)',
            'INSERT INTO public."T 1" VALUES (100)')  # fmt: skip
    ledger = str(tmp_path / "ledger")
    app = pg_url + ("&" if "?" in pg_url else "?") + "options=-csearch_path%3D%22MyApp%22"

    def fan(url: str, table: str, **kwargs: Any) -> FanOut:
        sink = {"type": "postgres", "name": "pg", "url": url, "table": table,
                "mode": "append", "partitions": 2}  # fmt: skip
        return FanOut("sp", ledger, [sink], retries=0, **kwargs)

    veto = VetoOnce(batch=1, partition=1, state=str(tmp_path / "veto"), sink="pg")
    first = fan(app, '"T 1"', plugins=[veto])
    with pytest.raises(BatchFailedError):
        first.process(spark.range(4, 8), BatchInfo("sp", 1, "q"))
    first.close()
    partial = _ids(pg_url, '"MyApp"."T 1"')
    assert 0 < len(partial) < 4, partial
    plain = fan(pg_url, '"T 1"')
    with pytest.raises(BatchFailedError) as refused:
        plain.process(spark.range(4, 8), BatchInfo("sp", 1, "q"))
    plain.close()
    text = str(refused.value.failures["pg"])
    assert 'now "MyApp"."T 1"), but table "T 1" has OID' in text, text
    marker = "or set option table to "
    printed = text[text.index(marker) + len(marker) :]
    printed = printed[: printed.index(", and restart")]
    assert printed == '"MyApp"."T 1"', printed
    named = fan(pg_url, printed)
    result = named.process(spark.range(4, 8), BatchInfo("sp", 1, "q"))["pg"]
    named.close()
    assert result.details["skipped_partitions"] == [0]
    assert _ids(pg_url, '"MyApp"."T 1"') == [4, 5, 6, 7]
    assert _ids(pg_url, 'public."T 1"') == [100]


def test_a_search_path_in_settings_finding_other_tables_is_said_at_open(
    spark: Any, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``settings: {search_path: app}`` with ``app.t1`` and ``app.rejects`` made by hand
    (an older fanout's partitions wrote their refused rows into ``app.rejects``): the sink
    writes ``public.t1`` and ``public.rejects``, as the URL's search path resolves them,
    and its open now says so, naming the tables the settings' path would find, instead of
    the letters moving silently."""
    _tables(pg_url)
    execute(pg_url, "CREATE TABLE app.rejects (LIKE public.t1)")
    caplog.set_level("WARNING", logger="fanout_postgres.sink")
    result = _run(spark, pg_url, tmp_path, "append", settings={"search_path": "app"})
    assert (result.rows, result.dead_lettered) == (4, 2)
    assert _ids(pg_url, "public.t1") == [0, 1, 3, 4]
    assert _letters(pg_url, "public.rejects") == [2, 5]
    said = [r.getMessage() for r in caplog.records if "option settings sets search_path" in
            r.getMessage()]  # fmt: skip
    assert said == [
        "sink 'pg': option settings sets search_path, under which t1 would be app.t1, but "
        "the sink writes public.t1 (the URL's search path resolves it there; settings apply "
        "to the write connections only): name the schema in the option, or set the search "
        "path in the URL (?options=-csearch_path%3D...)",
        "sink 'pg': option settings sets search_path, under which rejects would be "
        "app.rejects, but the sink writes public.rejects (the URL's search path resolves it "
        "there; settings apply to the write connections only): name the schema in the "
        "option, or set the search path in the URL (?options=-csearch_path%3D...)",
    ], said
