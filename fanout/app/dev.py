"""``fanout dev up|status|down``: the local development loop's services, in the background.

``up`` starts one detached process (``python -m fanout.app.dev serve STATE``) that runs the
embedded servers the installed plugins provide (:func:`fanout.hooks.specs.fanout_embedded_services`:
PostgreSQL with fanout-postgres, a Kafka-protocol broker with fanout-kafka), the ones the demo
uses, writes the environment a pipeline file needs to ``STATE/env`` (each service's
``env_var``: ``FANOUT_PG_URL``, ``FANOUT_KAFKA_BOOTSTRAP``; and ``FANOUT_DATA``), and stays
until ``down`` stops it. ``examples/pipeline.toml`` reads exactly
those variables, so the loop is::

    fanout dev up && . .fanout-dev/env
    fanout validate examples/pipeline.toml
    fanout run examples/pipeline.toml
    fanout status --ledger "$FANOUT_DATA/_fanout/ledger"
    fanout dev down
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from fanout.errors import ConfigurationError, FanoutError

DEFAULT_STATE = ".fanout-dev"
"""Where ``dev`` keeps its pid file, env file, logs and the services' data."""


def up(state: Path, timeout_s: float = 60.0) -> str:
    """Start the services in the background (unless already running); return the env
    file's text once they answer."""
    if running_pid(state) is not None:
        return (state / "env").read_text()
    state.mkdir(parents=True, exist_ok=True)
    (state / "env").unlink(missing_ok=True)
    with (state / "services.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "fanout.app.dev", "serve", str(state)],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this command and its terminal
        )
    (state / "pid").write_text(str(process.pid))
    deadline = time.monotonic() + timeout_s
    while not (state / "env").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            (state / "pid").unlink(missing_ok=True)
            tail = (state / "services.log").read_text(errors="replace")[-2000:]
            raise FanoutError(f"the dev services did not start; {state}/services.log:\n{tail}")
        time.sleep(0.2)
    return (state / "env").read_text()


def down(state: Path, timeout_s: float = 30.0) -> bool:
    """Stop the services; False when none were running."""
    pid = running_pid(state)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    for name in ("pid", "env"):
        (state / name).unlink(missing_ok=True)
    return True


def running_pid(state: Path) -> int | None:
    """The services' process id, when they run."""
    try:
        pid = int((state / "pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def silent(state: Path) -> list[str]:
    """The services of ``state``'s env file that do not answer (stopped by hand, say, while
    the process that started them runs on), each as ``"PostgreSQL (FANOUT_PG_URL): why"``;
    empty when every one answers (:attr:`fanout.hooks.services.EmbeddedService.answers`)."""
    from fanout.hooks.registry import load_registry

    exported: dict[str, str] = {}
    for line in (state / "env").read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        exported[name] = shlex.split(value)[0] if value else ""
    found = []
    for service in load_registry().embedded_services().values():
        address = exported.get(service.env_var)
        if address is None or service.answers is None:
            continue
        why = service.answers(address)
        if why is not None:
            found.append(f"{service.title} ({service.env_var}): {why}")
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child that exited but was not reaped yet is not running
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def serve(state: Path) -> None:
    """Run the services until SIGTERM/SIGINT (the detached process ``up`` starts)."""
    from fanout.hooks.registry import load_registry

    registry = load_registry()
    registry.raise_load_errors()
    services = registry.embedded_services()
    stopped = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    data = state / "data"
    (data / "input").mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        env = {
            service.env_var: str(stack.enter_context(service.start(state)))
            for service in services.values()
        }
        env["FANOUT_DATA"] = str(data.resolve())
        text = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        (state / "env.tmp").write_text(text)
        (state / "env.tmp").replace(state / "env")
        while not stopped:
            time.sleep(0.2)


def main(argv: list[str]) -> int:
    """``python -m fanout.app.dev serve STATE``."""
    if len(argv) != 2 or argv[0] != "serve":
        raise ConfigurationError("usage: python -m fanout.app.dev serve STATE_DIR")
    serve(Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
