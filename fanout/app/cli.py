"""The ``fanout`` command: plugins, status, ledger maintenance, the demo, and the commands
plugins contribute (``fanout migrate`` comes with fanout-postgres) through
:func:`fanout.hooks.specs.fanout_cli_commands`.

Exit codes: 0 success, 1 failure (also a sink whose target cannot be reached when it is
opened: the options may be right; ``fanout run`` and ``fanout validate`` alike),
2 configuration error (bad arguments or options);
``fanout run`` also 3 when it ends (its trigger, or a signal's clean stop) with a lagging
sink still missing batches, and 128 + the signal's number when a stop abandons a batch
(:func:`fanout.app.runner.run`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fanout.app.commands import (
    demo,
    dev,
    lift_fence,
    maintain,
    plugins,
    recover,
    run,
    skip,
    status,
    validate,
)
from fanout.app.commands.output import masked_text
from fanout.app.commands.recover import RECOVER_WHILE_RUNNING
from fanout.app.commands.skip import SKIP_WHILE_RUNNING
from fanout.errors import ConfigurationError, FanoutError, SinkUnreachableError
from fanout.observe.logs import RedactingStream, register_secrets
from fanout.observe.logs import configure as configure_logging
from fanout.observe.secrets import location_secrets
from fanout.version import __version__

if TYPE_CHECKING:
    from fanout.hooks.registry import Registry

__all__ = [
    "EXIT_BROKEN_PIPE",
    "RECOVER_WHILE_RUNNING",
    "SKIP_WHILE_RUNNING",
    "UNREACHABLE_NEXT",
    "build_parser",
    "installed_plugins",
    "main",
]


EXIT_BROKEN_PIPE = 128 + 13
"""What a shell reports for a tool that SIGPIPE ended (``fanout status --json | head``)."""


UNREACHABLE_NEXT = (
    "fanout: the sink's target could not be reached, which is not always a mistake in the "
    "pipeline file: if its server is down, run the same command again once it accepts "
    "connections; if a host name that does not resolve or a port nothing listens on is in "
    "its options, fix them (`fanout validate PIPELINE.toml` checks them). A sink with "
    'on_failure = "lag" starts behind instead, the other sinks going on without it.'
)
"""What to do about a :class:`fanout.SinkUnreachableError` that stopped a command: the
same error comes of a server down and of a misspelt host or port (a sink cannot tell them
apart), so both are named."""


def build_parser(registry: Registry | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``fanout`` command: the core's commands, then those the
    plugins of ``registry`` contribute (default: the installed plugins, :func:`installed_plugins`).

    :raises PluginError: when a plugin's command takes a core command's or another plugin's
        name.
    """
    parser = argparse.ArgumentParser(
        prog="fanout", description="Exactly-once fan-out of a Spark stream to many sinks."
    )
    parser.add_argument("--version", action="version", version=f"fanout {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default)")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one object a line"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for module in (run, validate, dev, plugins, status, recover):
        module.add_command(sub)
    ledger = sub.add_parser("ledger", help="ledger operations")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    for module in (maintain, skip, lift_fence):
        module.add_command(ledger_sub)
    demo.add_command(sub)

    registry = installed_plugins() if registry is None else registry
    for command in registry.cli_commands(taken=set(sub.choices)):
        added = sub.add_parser(command.name, help=command.help)
        command.add_arguments(added)
        added.set_defaults(func=command.run)
    return parser


def installed_plugins() -> Registry:
    """The registry of the installed plugins (a plugin that fails to load contributes no
    command; ``fanout plugins`` says why)."""
    from fanout.hooks.registry import load_registry

    return load_registry()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fanout`` console script."""
    registry = installed_plugins()
    try:
        parser = build_parser(registry)
    except FanoutError as exc:  # two plugins claiming one command: nothing can run safely
        print(f"fanout: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 2:  # a bad command line; a command may be missing with its plugin
            for error in registry.load_errors:
                print(f"fanout: note: {error}", file=sys.stderr)
        raise
    configure_logging(args.log_level, args.log_format)
    register_secrets(location_secrets(list(vars(args).values())))  # --ledger s3://k:pw@...
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err)  # type: ignore[assignment]
    code = _run(args)
    # put back only on a return: the traceback of an error raised through here, which the
    # interpreter prints to sys.stderr after main, may name a location's password too
    sys.stdout, sys.stderr = out, err
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; a :class:`fanout.FanoutError` becomes its message and exit
    code."""
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that went away shows up here, not at exit
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except SinkUnreachableError as exc:  # also a ConfigurationError: a server down is not one
        print(f"fanout: sink unreachable: {_masked(exc)}\n{UNREACHABLE_NEXT}", file=sys.stderr)
        return 1
    except ConfigurationError as exc:
        print(f"fanout: configuration error: {_masked(exc)}", file=sys.stderr)
        return 2
    except FanoutError as exc:
        print(f"fanout: {type(exc).__name__}: {_masked(exc)}", file=sys.stderr)
        return 1


def _masked(error: BaseException) -> str:
    """``error``'s text with every secret the sinks registered masked (stderr has no log
    handler to do it)."""
    return masked_text(str(error))


def _discard_stdout() -> None:
    """After the reader of stdout went away: quietly, like other Unix tools. Point stdout at
    /dev/null so the interpreter's final flush does not raise a second time."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (captured): nothing will flush to a pipe
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
