"""``fanout run`` ends a failed run with fanout's own error, whole, printed last; the
traces go to a file it names (issue 14, item 3).

The commands run in the test's process and SparkSession (the ``fanout_cli`` fixture:
``fanout.app.cli.main``, which returns the code the console script exits with), a Spark
start less each; what they print and return is what is proven here. The first test keeps
``fanout run`` a process of its own: a failed batch's exit code through the real entry
point's ``sys.exit``, and its output with nothing of Spark's console log in it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.integration.streams import pipeline_file

if TYPE_CHECKING:
    from tests.in_process_cli import Ran

SINKS = """[[sinks]]
type = "delta"
name = "bronze"
path = "{data}/bronze"

[[sinks]]
type = "delta"
name = "latest"
path = "{data}/latest"
mode = "merge"
keys = ["order_id"]
"""
ONE_ORDER = [{"order_id": 7, "amount": 1.0}]


def _pipeline(data: Path, rows: list[dict[str, Any]] | None, more: str = "") -> Path:
    """``data/pipeline.toml``: pipeline ``dupes``, run available now, reading the JSON file
    ``data/input/a.json`` of ``rows`` (none: no file) into the Delta sinks ``bronze`` and
    ``latest`` (a merge by order_id), and the sinks in ``more`` (TOML appended)."""
    (data / "input").mkdir()
    if rows is not None:
        (data / "input" / "a.json").write_text("\n".join(json.dumps(r) for r in rows))
    config = data / "pipeline.toml"
    sinks = SINKS.format(data=data) + more
    schema = "order_id LONG, amount DOUBLE"
    config.write_text(
        pipeline_file(data, "dupes", schema, sinks, available_now=True, master="local[2]")
    )
    return config


def _postgres(url: str, more: str = "") -> str:
    """A postgres sink ``pg`` of table ``orders`` at ``url`` (TOML, ``more`` options too)."""
    return (
        f'\n[[sinks]]\ntype = "postgres"\nname = "pg"\nurl = "{url}"\ntable = "orders"\n'
        f'keys = ["order_id"]\ncreate_table = true\n{more}'
    )


def _process(command: str, config: Path) -> subprocess.CompletedProcess[str]:
    """``fanout COMMAND CONFIG`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "fanout.app.cli", command, str(config)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_failed_run_ends_with_fanouts_own_message(tmp_path: Path) -> None:
    rows = [{"order_id": 7, "amount": 1.0}, {"order_id": 7, "amount": 2.0}]  # no order_by
    done = _process("run", _pipeline(tmp_path, rows))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    # Spark reports no progress for the failed batch: its 2 rows read "0 rows in"
    assert "pipeline 'dupes': 1 batch, 2 rows in, 1 failed" in lines, done.stdout
    failed = next(i for i, line in enumerate(lines) if line.startswith("pipeline 'dupes' failed:"))
    summary = lines[failed:]
    assert summary[0] == (
        "pipeline 'dupes' failed: pipeline 'dupes', batch 0: 1 sink(s) failed (latest); bronze "
        "committed the batch and will be skipped when the query restarts and Spark replays it:"
    )
    assert summary[1].startswith("  - latest: ")
    assert "order_id" in summary[1] and "7" in summary[1]
    assert summary[-1].startswith("(the full trace, Spark's included: ")
    trace = Path(summary[-1].removeprefix("(the full trace, Spark's included: ").rstrip(")"))
    assert "Traceback (most recent call last)" in trace.read_text()
    assert len(summary) == 3  # the message, whole, and where the trace is: nothing else
    for line in lines:
        assert "Traceback" not in line and "raise BatchFailedError" not in line
        assert not line.lstrip().startswith("at org.apache")


def test_a_route_or_key_the_source_lacks_stops_the_run_before_the_stream_starts(
    fanout_cli: Callable[..., Ran],
    tmp_path: Path,
) -> None:
    """`fanout validate` caught both; `fanout run` started the stream, made the checkpoint,
    wrote bronze's batch 0 and then failed the two sinks at that batch (exit 1)."""
    big = f'\n[[sinks]]\ntype = "delta"\nname = "big"\npath = "{tmp_path}/big"\n'
    big += 'where = "amout > 10"\n'
    config = _pipeline(tmp_path, ONE_ORDER, big)
    config.write_text(config.read_text().replace('keys = ["order_id"]', 'keys = ["orderid"]'))
    done = fanout_cli("run", config)
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    error = done.stderr[done.stderr.index("fanout: configuration error: ") :].splitlines()
    assert error[0] == (
        "fanout: configuration error: 2 sink(s) cannot take the source's rows; nothing "
        f"started (`fanout validate {config}` runs every check):"
    )
    assert error[1] == (
        "  - sink 'latest': option 'keys' names column(s) 'orderid' not in the batch (the "
        "batch's columns: order_id, amount); fix the option or add the column(s) to the stream"
    )
    assert error[2] == (
        "  - sink 'big': route where 'amout > 10' cannot be applied to the batch: "
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with "
        "name `amout` cannot be resolved. Did you mean one of the following? [`amount`, "
        "`order_id`]. SQLSTATE: 42703; line 1 pos 0; fix the sink's 'where' against the "
        "batch's columns, or add to the stream what it names"
    )
    assert len(error) == 3
    assert not (tmp_path / "checkpoint").exists()
    assert not (tmp_path / "bronze").exists()


def test_a_deleted_checkpoint_ends_the_run_with_the_reset_error_whole(
    fanout_cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """The guard's CheckpointResetError is raised before any sink writes (no failed batch):
    the run printed Spark's first line, `An exception was raised by the Python Proxy.
    Return Message: Traceback (most recent call last):`, and nothing of what to do."""
    import shutil

    config = _pipeline(tmp_path, [{"order_id": 7, "amount": 1.0}, {"order_id": 8, "amount": 2.0}])
    first = fanout_cli("run", config)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "pipeline 'dupes' finished (last committed batch 0)" in first.stdout
    shutil.rmtree(tmp_path / "checkpoint")
    done = fanout_cli("run", config)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    failed = next(i for i, line in enumerate(lines) if line.startswith("pipeline 'dupes' failed:"))
    summary = lines[failed:]
    assert summary[0].startswith(
        "pipeline 'dupes' failed: pipeline 'dupes': checkpoint reset detected. Spark handed "
        "batch 0 of query "
    )
    assert any(line.startswith("  - bronze: batch 0, query id ") for line in summary)
    assert "How to proceed:" in summary
    assert summary[-2] == (  # the run came from a pipeline file: recover reads it too
        f"  `fanout recover --config {config}` prints these facts again, with Kafka "
        "startingOffsets, and asks each sink whether it holds a batch written but never marked."
    )
    assert summary[-1].startswith("(the full trace, Spark's included: ")
    assert not any("Traceback" in line or "Streaming Query" in line for line in lines)


def test_a_sink_whose_server_is_down_at_the_start_is_not_called_a_configuration_error(
    fanout_cli: Callable[..., Ran],
    tmp_path: Path,
) -> None:
    """PostgreSQL stopped, then `fanout run` started again: it printed `fanout: configuration
    error: sink 'pg': cannot open: ...` and exited 2, as for a misspelt option, though the
    file was right and the server only down; the password in the URL stays masked."""
    (tmp_path / "nosocket").mkdir()  # no server listens here
    url = f"postgresql+psycopg2://app:Wr0ngPassw0rd@/db?host={tmp_path}/nosocket"
    done = fanout_cli("run", _pipeline(tmp_path, ONE_ORDER, _postgres(url)))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    error = done.stderr[done.stderr.index("fanout: sink unreachable: ") :].splitlines()
    assert error[0] == (
        "fanout: sink unreachable: sink 'pg': cannot open: OperationalError: "
        '(psycopg2.OperationalError) connection to server on socket "'
        f'{tmp_path}/nosocket/.s.PGSQL.5432" failed: No such file or directory Is the server '
        "running locally and accepting connections on that socket?; check the host and port "
        "in option 'url', and that the server runs and accepts connections from this machine"
    )
    assert error[1:] == UNREACHABLE_NEXT
    assert "Wr0ngPassw0rd" not in done.stdout + done.stderr
    assert not (tmp_path / "checkpoint").exists()
    assert not (tmp_path / "bronze").exists()


UNREACHABLE_NEXT = [
    "fanout: the sink's target could not be reached, which is not always a mistake in the "
    "pipeline file: if its server is down, run the same command again once it accepts "
    "connections; if a host name that does not resolve or a port nothing listens on is in "
    "its options, fix them (`fanout validate PIPELINE.toml` checks them). A sink "
    'with on_failure = "lag" starts behind instead, the other sinks going on without it.'
]


def test_a_sink_host_name_that_does_not_resolve_is_not_told_to_wait_for_an_answer(
    fanout_cli: Callable[..., Ran],
    tmp_path: Path,
) -> None:
    """A misspelt PostgreSQL host: 'could not translate host name', exit 1, and the next
    line said the target 'did not answer; its options may be right: once it accepts
    connections, run the same command again', which no wait fixes."""
    url = "postgresql+psycopg2://app:Wr0ngPassw0rd@nosuchhost.invalid:5432/db"
    done = fanout_cli("run", _pipeline(tmp_path, ONE_ORDER, _postgres(url)))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    error = done.stderr[done.stderr.index("fanout: sink unreachable: ") :].splitlines()
    assert error[0].startswith(
        "fanout: sink unreachable: sink 'pg': cannot open: OperationalError: "
        '(psycopg2.OperationalError) could not translate host name "nosuchhost.invalid"'
    )
    assert error[1:] == UNREACHABLE_NEXT
    assert "Wr0ngPassw0rd" not in done.stdout + done.stderr


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_validate_and_run_exit_alike_for_a_sink_on_a_closed_port(
    fanout_cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """A PostgreSQL sink pointing at a port nothing listens on: `fanout run` exited 1
    (`sink unreachable`) and `fanout validate` 2 (`configuration error`), so a script
    branching on the code got two answers for one target. Both exit 1 now, saying so."""
    url = f"postgresql+psycopg2://app:Wr0ngPassw0rd@127.0.0.1:{_closed_port()}/db"
    config = _pipeline(tmp_path, ONE_ORDER, _postgres(url))
    codes, errors = {}, {}
    for command in ("validate", "run"):
        done = fanout_cli(command, config)
        codes[command] = done.returncode
        errors[command] = done.stderr[done.stderr.index("fanout: ") :].splitlines()
        assert "Wr0ngPassw0rd" not in done.stdout + done.stderr
    assert codes == {"validate": 1, "run": 1}, errors
    assert errors["validate"][0] == "fanout: sink unreachable: 1 of 10 checks failed:"
    assert errors["validate"][1].startswith(
        "  - sink pg: opens its target: sink 'pg': cannot open: OperationalError: "
    )
    assert errors["validate"][2:] == UNREACHABLE_NEXT
    assert errors["run"][0].startswith("fanout: sink unreachable: sink 'pg': cannot open: ")
    assert errors["run"][1:] == UNREACHABLE_NEXT


def test_validate_exits_2_when_a_mistake_in_the_file_comes_with_an_unreachable_sink(
    fanout_cli: Callable[..., Ran],
    tmp_path: Path,
) -> None:
    """The unreachable sink alone would exit 1; a route naming a column the source does
    not have, beside it, is a mistake in the file: exit 2, both failures listed."""
    url = f"postgresql+psycopg2://app:pw@127.0.0.1:{_closed_port()}/db"
    typo = (
        f'\n[[sinks]]\ntype = "delta"\nname = "typo"\npath = "{tmp_path / "typo"}"\n'
        'select = ["order_id", "amout * 100 AS cents"]\n'
    )
    done = fanout_cli("validate", _pipeline(tmp_path, None, _postgres(url) + typo))
    assert done.returncode == 2, done.stdout + done.stderr[-3000:]
    error = done.stderr[done.stderr.index("fanout: configuration error: ") :].splitlines()
    assert error[0] == "fanout: configuration error: 2 of 13 checks failed:"
    assert error[1].startswith("  - sink pg: opens its target: sink 'pg': cannot open: ")
    assert error[2].startswith("  - sink typo: route resolves")


def test_validate_warns_and_run_starts_for_an_unreachable_lag_sink(
    fanout_cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """A sink with on_failure = "lag" on a port nothing listens on: `fanout run` starts
    without it (the Delta sinks write, the batch is spooled for it) and exits 3, still
    behind; `fanout validate` failed the same file with exit 1, `sink unreachable`, so a
    pre-flight refused what the run does. It warns now, and exits 0."""
    url = f"postgresql+psycopg2://app:Wr0ngPassw0rd@127.0.0.1:{_closed_port()}/db"
    config = _pipeline(tmp_path, ONE_ORDER, _postgres(url, 'on_failure = "lag"\n'))
    spool = f'retries = 0\nspool = "{tmp_path}/spool"\n'
    config.write_text(config.read_text().replace("retries = 0\n", spool))
    done = {command: fanout_cli(command, config) for command in ("validate", "run")}
    for outcome in done.values():
        assert "Wr0ngPassw0rd" not in outcome.stdout + outcome.stderr
    checked = done["validate"]
    assert (checked.returncode, done["run"].returncode) == (0, 3), (
        checked.stdout + checked.stderr[-3000:] + done["run"].stderr[-3000:]
    )
    warned = [line for line in checked.stdout.splitlines() if line.startswith("  WARN")]
    assert len(warned) == 1, checked.stdout
    assert warned[0].startswith(
        "  WARN  sink pg: opens its target: sink 'pg': cannot open: OperationalError: "
    )
    assert warned[0].endswith(
        '; with on_failure = "lag" `fanout run` starts without it, spools its batches and '
        "writes them once it opens (a run that stops with it still behind exits 3)"
    )
    assert [line for line in checked.stdout.splitlines() if line.startswith("  FAIL")] == []
    assert "1 sink(s) behind" in done["run"].stdout + done["run"].stderr
