"""``fanout status`` / ``recover`` / ``--version`` as a user meets them: wrong names, wrong
tables, narrow terminals, pipes closed early. A real (delta-rs) ledger; no Spark."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from fanout.app import activity
from fanout.app.cli import main
from fanout.app.status import summarize
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc
from fanout.version import __version__
from tests.newest_lines import split_newest, status_only

ROOT = Path(__file__).resolve().parents[2]
LONG_ERROR = (
    "SinkWriteError: sink 'warehouse_orders_latest' failed on batch 3: "
    "psycopg2.OperationalError: connection to server at 10.0.0.7 port 5432 refused"
)


def _ledger(path: Path) -> str:
    ledger = DeltaLedger(str(path))
    ledger.open()
    for batch in range(2):
        for sink in ("bronze_orders_lake", "warehouse_orders_latest"):
            ledger.mark_committed(
                LedgerEntry(
                    "orders_to_everywhere",
                    sink,
                    batch,
                    "committed",
                    query_id="q1",
                    rows=1000 + batch,
                    dead_lettered=batch,
                    finished_at=now_utc(),
                )
            )
    ledger.record_failure(
        LedgerEntry(
            "orders_to_everywhere",
            "warehouse_orders_latest",
            2,
            "failed",
            query_id="q1",
            error=LONG_ERROR,
        )
    )
    ledger.mark_committed(LedgerEntry("clicks", "x", 0, "committed", query_id="q2", rows=1))
    return str(path)


def test_status_of_an_unknown_pipeline_names_the_known_ones_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _ledger(tmp_path / "ledger")
    assert main(["status", "--ledger", path, "--pipeline", "nope"]) == 1
    err = capsys.readouterr().err
    assert (
        f"the ledger at {path} holds no pipeline 'nope'; "
        "it knows: 'clicks', 'orders_to_everywhere'" in err
    )


def test_recover_of_an_unknown_pipeline_names_the_known_ones_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _ledger(tmp_path / "ledger")
    assert main(["recover", "--ledger", path, "--pipeline", "nope"]) == 1
    captured = capsys.readouterr()
    assert "holds no pipeline 'nope'; it knows: 'clicks', 'orders_to_everywhere'" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("command", [["status"], ["recover", "--pipeline", "orders"]])
def test_a_delta_table_that_is_not_a_ledger_is_refused_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    path = str(tmp_path / "orders")
    write_deltalake(path, pa.table({"id": [1, 2], "amount": [3.5, 4.0]}))
    assert main([*command, "--ledger", path]) == 1
    err = capsys.readouterr().err
    assert (
        f"LedgerError: the Delta table at {path} is not a fanout ledger: it has no columns "
        "'batch_id', 'pipeline', 'sink', 'status' (its columns: 'id', 'amount')" in err
    )
    assert "Traceback" not in err


def test_status_fits_100_columns_and_wide_shows_the_details(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _ledger(tmp_path / "ledger")
    made = now_utc()  # the newest mark's age as of the ledger's making, however slow the rest
    monkeypatch.setattr(activity, "clock", lambda: made)
    assert main(["status", "--ledger", path]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100, out  # the newest marks too
    rest, newest = split_newest(out)
    lines = rest.splitlines()
    assert newest[0] == (
        "pipeline 'clicks': no write mark with its time yet (never ran, no sink committed a "
        "batch, or its marks carry no time)"
    )
    assert re.fullmatch(
        r"pipeline 'orders_to_everywhere' looks running: its newest mark is batch 1 of epoch 0 "
        r"by sink '\w+', \d+s ago \(.* UTC\); window 1m \(3 x \d+s, the median gap between its "
        r"latest batches, at least 1m\)",  # the gap: two Delta commits, a second or more
        newest[1],
    ), newest
    assert len(newest) == 2
    assert lines[0].split() == [
        "pipeline", "sink", "last", "batch", "rows", "(total)", "failed", "last", "commit", "(UTC)",
    ]  # fmt: skip
    body = [line.split() for line in lines[2:5]]
    assert body[0] == ["clicks", "x", "0", "1", "0", "-"]  # committed without a finish time
    assert [row[:5] for row in body[1:]] == [
        ["orders_to_everywhere", "bronze_orders_lake", "1", "2001", "0"],
        ["orders_to_everywhere", "warehouse_orders_latest", "1", "2001", "1"],
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", " ".join(r[5:])) for r in body[1:])
    assert lines[5:] == [
        "",
        "1 sink has failed attempts; `fanout status --wide` or `--json` shows the last error.",
    ]

    assert main(["status", "--ledger", path, "--wide"]) == 0
    wide = capsys.readouterr().out
    assert "dead letters" in wide and "last error" in wide
    assert "SinkWriteError: sink 'warehouse_orders_latest' failed on batch 3" in wide


def test_status_json_into_a_pipe_closed_early_exits_quietly(tmp_path: Path) -> None:
    path = _ledger(tmp_path / "ledger")
    child = subprocess.Popen(
        [sys.executable, "-m", "fanout.app.cli", "status", "--json", "--ledger", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # like `| head -0`: the reader is gone before the first line
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141, err
    assert err == ""


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"fanout {__version__}\n"


def test_readme_command_list_names_every_command() -> None:
    from fanout.app.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Command line", 1)[1].split("```", 2)[1]
    listed = set(re.findall(r"^fanout (\w+)", block, re.M))
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert commands <= listed, f"missing from README's command list: {sorted(commands - listed)}"


def test_status_json_keeps_every_detail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _ledger(tmp_path / "ledger")
    assert main(["status", "--ledger", path, "--pipeline", "orders_to_everywhere", "--json"]) == 0
    status = {s["sink"]: s for s in json.loads(capsys.readouterr().out)}
    assert status["warehouse_orders_latest"]["last_error"] == LONG_ERROR
    assert status["bronze_orders_lake"]["dead_lettered_total"] == 1


def test_status_watch_redraws_count_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _ledger(tmp_path / "ledger")
    assert main(["status", "--ledger", path]) == 0
    table = capsys.readouterr().out
    argv = ["status", "--ledger", path, "--watch", "--count", "3", "--interval", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out  # not a terminal: no screen clearing, refreshes one after another
    blocks = re.split(r"\n(?=fanout status --ledger )", out)
    assert len(blocks) == 3
    header = rf"fanout status --ledger {re.escape(path)}: \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC, "
    for block in blocks:  # each draw with the newest marks of its time
        first, rest = block.split("\n\n", 1)
        assert re.fullmatch(header + "every 0s; Ctrl-C stops", first), first
        assert status_only(rest).rstrip("\n") == status_only(table).rstrip("\n")


def test_status_watch_checks_the_spool_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each redraw re-opened the spool's index only to check that it is there."""
    import fanout.spool.index as spool_index
    import fanout.spool.table as spool_table

    path = _ledger(tmp_path / "ledger")
    spool = str(tmp_path / "spool")
    spool_table.Spool(spool, "orders_to_everywhere").open()  # creates its index
    assert main(["status", "--ledger", path, "--spool", spool]) == 0
    table = capsys.readouterr().out
    checked: list[str] = []
    existing_index = spool_index.existing_index

    def counted(path: str, *args: Any, **kwargs: Any) -> Any:
        checked.append(path)
        return existing_index(path, *args, **kwargs)

    monkeypatch.setattr(spool_index, "existing_index", counted)
    argv = ["status", "--ledger", path, "--spool", spool, "--watch", "--count", "3"]
    assert main([*argv, "--interval", "0"]) == 0
    assert checked == [spool]
    blocks = re.split(r"\n(?=fanout status --ledger )", capsys.readouterr().out)
    drawn = [status_only(block.split("\n\n", 1)[1]).rstrip("\n") for block in blocks]
    assert drawn == [status_only(table).rstrip("\n")] * 3


def test_status_watch_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    path = _ledger(tmp_path / "ledger")
    # faulthandler: a child that hangs prints every thread's stack on SIGABRT (below)
    command = ["-X", "faulthandler", "-m", "fanout.app.cli", "status", "--ledger", path]
    child = subprocess.Popen(
        [sys.executable, *command, "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,  # read the first line without reading ahead
    )
    assert child.stdout is not None and child.stderr is not None
    # a child that never draws is killed, so the reads below end (at its output's end)
    # instead of waiting for pytest-timeout with nothing said (a loaded machine once did)
    watchdog = threading.Timer(120, child.kill)
    watchdog.start()
    try:
        first = child.stdout.readline().decode()
        assert first.startswith(f"fanout status --ledger {path}: "), child.stderr.read()
        while not (line := child.stdout.readline()).endswith(b"at least 1m)\n"):
            # the first table, whole, with its newest marks (orders_to_everywhere's last)
            assert line, f"the status ended before its first table: {child.stderr.read()!r}"
    finally:
        watchdog.cancel()
    child.send_signal(signal.SIGINT)  # what Ctrl-C sends, during the 5 s wait
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        pytest.fail(f"still running 60 s after Ctrl-C; its threads: {child.communicate()[1]!r}")
    assert child.returncode == 0, err
    assert (out, err) == (b"\n", b"")  # one newline after ^C, no traceback


def test_a_fanout_pointed_at_a_table_that_is_not_a_ledger_refuses_to_open(
    tmp_path: Path,
) -> None:
    from fanout.errors import LedgerError

    path = str(tmp_path / "orders")
    write_deltalake(path, pa.table({"id": [1], "status": ["paid"]}))
    with pytest.raises(
        LedgerError,
        match="is not a fanout ledger: it has no columns 'batch_id', "
        "'pipeline', 'sink' \\(its columns: 'id', 'status'\\)",
    ):
        DeltaLedger(path).open()


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["recover", "--pipeline", "orders"],
        ["ledger", "maintain"],
        ["ledger", "skip", "--pipeline", "orders", "--sink", "pg", "--through", "1"],
    ],
)
def test_a_ledger_path_that_is_a_file_is_a_configuration_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    file = tmp_path / "ledger.txt"
    file.write_text("not a table\n")
    assert main([*command, "--ledger", str(file)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        f"fanout: configuration error: ledger at {file}: it is a file, not a directory: a "
        "Delta table is a directory; give the table's directory, or a path where nothing is "
        "yet to create one there\n"
    )
    assert captured.out == ""


def test_a_ledger_in_a_store_that_cannot_be_reached_is_a_ledger_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs' OSError went through (a traceback), and its cause chain was on lines
    after the first, in terminal colours."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends: nothing listens
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "not-a-secret-here",
        "AWS_REGION": "us-east-1",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert main(["status", "--ledger", "s3://lake/_fanout/ledger"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "fanout: LedgerError: cannot read the ledger at s3://lake/_fanout/ledger (check the "
        "path, the store's credentials: storage options or the environment delta-rs reads "
        "them from, and that it can be reached): OSError: Kernel error -> Generic S3 error -> "
        f"Error performing GET http://127.0.0.1:{port}/lake/_fanout/ledger/_delta_log/"
    )
    assert captured.err.endswith(" -> Connection refused (os error 111)\n")
    assert captured.err.count("\n") == 1 and "\x1b" not in captured.err


def test_a_ledger_that_cannot_be_opened_names_its_location_without_the_password() -> None:
    """The error itself, not only the CLI's masking stream (before, the raw location, in
    fanout's words and in the store's, reached any caller of ``DeltaLedger``)."""
    from fanout.errors import LedgerError

    secret = "LongSecretPassw0rd"
    ledger = DeltaLedger(f"az://user:{secret}@x/ledger")
    for call in (ledger.exists, ledger.check):
        with pytest.raises(LedgerError) as refused:
            call()
        assert secret not in str(refused.value)
        assert str(refused.value).startswith(
            "cannot read the ledger at az://user:***@x/ledger (check the path, the store's "
            "credentials: storage options or the environment delta-rs reads them from, and "
            "that it can be reached): OSError: "
        ), str(refused.value)
        assert str(refused.value).endswith(" -> az://user:***@x/ledger"), str(refused.value)


def test_status_of_a_batch_whose_lost_mark_a_write_s_own_mark_replaced_shows_the_own_mark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fanout recover`` recorded a lost mark of batch 1 while it was in flight, and the
    query's own mark of it replaced it (§5, "A batch in flight"): the ledger holds both
    rows. Status showed the lost one as the sink's last batch (its rows null: `-`, its
    time the recover's), though every reader of the marks sees the own mark alone."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    first = LedgerEntry("p", "pg", 0, "committed", query_id="q1", rows=10, dead_lettered=1,
                        finished_at=now_utc())  # fmt: skip
    lost = LedgerEntry("p", "pg", 1, "committed", query_id="q1",
                       error="unmarked: recorded by fanout recover: it holds the batch",
                       finished_at=now_utc())  # fmt: skip
    own = LedgerEntry("p", "pg", 1, "committed", query_id="q1", rows=30, dead_lettered=2,
                      finished_at=now_utc())  # fmt: skip
    for entry in (first, lost, own):
        assert ledger.mark_committed(entry) is True
    ledger.maintain(vacuum_retention_hours=None)  # the compaction rewrites the rows' order
    assert main(["status", "--ledger", str(tmp_path / "ledger"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    [newest] = [sink.pop("pipeline_newest_mark") for sink in shown]
    assert (newest["sink"], newest["batch_id"], newest["epoch"]) == ("pg", 1, 0)
    assert newest["at"] == own.finished_at.isoformat()  # the write's, not the lost mark's
    rows = ledger.read("p").to_pylist()  # whichever of the two rows a scan gives first
    for order in (rows, rows[::-1]):
        assert json.loads(json.dumps([s.as_json() for s in summarize(order)], default=str)) == shown
    assert shown == [
        {
            "pipeline": "p",
            "sink": "pg",
            "last_committed_batch": 1,
            "last_batch_rows": 30,
            "committed_batches": 2,
            "rows_total": 40,
            "dead_lettered_total": 3,
            "last_commit_at": own.finished_at.isoformat(),
            "failed_attempts": 0,
            "last_error": None,
            "state": "live",
            "lag_batches": 0,
            "lag_rows": 0,
            "lagging_since": None,
            "kept": [],
            "given_up": [],
        }
    ]


def _az_spool_pipeline(tmp_path: Path, secret: str) -> Path:
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = "{tmp_path}/ck"\n'
        f'spool = "az://user:{secret}@x/spool"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "a"\npath = "{tmp_path}/a"\n'
    )
    return config


def test_a_traceback_masks_a_password_in_a_location() -> None:
    """An error the command does not catch, naming a location given on the command line,
    password and all: the interpreter prints its traceback after ``main`` returned, through
    the masking streams (before, ``main`` had put the unmasked ones back)."""
    secret = "LongSecretPassw0rd"
    crash = (
        "import sys\n"
        "import fanout.app.cli as cli\n"
        "import fanout.app.commands.status as status_command\n"
        "def boom(args):\n"
        "    raise OSError('store refused ' + args.ledger)\n"
        "status_command.cmd_status = boom\n"
        f"sys.exit(cli.main(['status', '--ledger', 'az://user:{secret}@x/ledger']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", crash], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" in done.stderr and done.returncode == 1, done.stderr
    assert secret not in done.stdout + done.stderr
    assert "OSError: store refused az://user:***@x/ledger" in done.stderr, done.stderr


def test_a_spool_the_store_refuses_is_said_and_the_ledger_still_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status --config`` with a spool on a store it cannot read (before: delta-rs' bare
    ``OSError`` and a traceback): a note naming the spool, masked, and the sinks' table."""
    secret = "LongSecretPassw0rd"
    config = _az_spool_pipeline(tmp_path, secret)
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    ledger.mark_committed(LedgerEntry("p", "a", 0, "committed", rows=3))
    assert main(["status", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err
    assert err.startswith(
        "pipeline 'p': cannot read the spool at az://user:***@x/spool (check the path, the "
        "store's credentials"
    ), err
    assert err.rstrip().endswith("(its spooled batches and the sinks lagging on them not shown)")
    assert out.splitlines()[2].split()[:3] == ["p", "a", "0"], out


def test_status_s_last_error_is_the_newest_failed_attempt_whatever_its_batch(
    tmp_path: Path,
) -> None:
    """A sink that could not be opened failed each live batch (2 to 4, attempt 1); the next
    run's catch-up found its target lost and recorded that at its oldest missed batch, 2:
    the newest failure, which status must show (not batch 4's older one)."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    for batch in (2, 3, 4):
        ledger.record_failure(
            LedgerEntry("p", "pg", batch, "failed", query_id="q1", attempt=1,
                        error="SinkUnreachableError: down", finished_at=now_utc())
        )  # fmt: skip
    ledger.record_failure(
        LedgerEntry("p", "pg", 2, "failed", query_id="q2", attempt=1,
                    error="TargetLostError: gone", finished_at=now_utc())
    )  # fmt: skip
    rows = ledger.read("p").to_pylist()
    for order in (rows, rows[::-1]):
        (status,) = summarize(order)
        assert (status.last_error, status.failed_attempts) == ("TargetLostError: gone", 4)
