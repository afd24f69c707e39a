"""``fanout dev``: the local development services (:mod:`fanout.app.dev`)."""

from __future__ import annotations

import argparse

from fanout.errors import shell_word


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout dev`` to ``commands``."""
    dev = commands.add_parser(
        "dev", help="local PostgreSQL and Kafka for the example pipeline: up, status, down"
    )
    dev.add_argument("action", choices=["up", "status", "down"])
    dev.add_argument(
        "--state", default=".fanout-dev", help="pid, env file, logs and data (default .fanout-dev)"
    )
    dev.set_defaults(func=cmd_dev)


def cmd_dev(args: argparse.Namespace) -> int:
    """Start, show or stop the local development services (``fanout.app.dev``)."""
    from pathlib import Path

    from fanout.app import dev

    state = Path(args.state)
    if args.action == "up":
        env = dev.up(state)
        print(env, end="")
        print(f"# services running (pid {dev.running_pid(state)}); load them with: . {state}/env")
        return 0
    if args.action == "status":
        pid = dev.running_pid(state)
        if pid is None:
            print(f"no dev services running for {state}")
            return 1
        silent = dev.silent(state)
        if silent:
            print(
                f"dev services stopped: their process (pid {pid}) runs, but "
                + "; ".join(silent)
                + f". Start them again: fanout dev down --state {shell_word(str(state))} && "
                f"fanout dev up --state {shell_word(str(state))}"
            )
            return 1
        print(f"dev services running (pid {pid}):")
        print((state / "env").read_text(), end="")
        return 0
    stopped = dev.down(state)
    print("dev services stopped" if stopped else f"no dev services running for {state}")
    return 0
