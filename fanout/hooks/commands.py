"""What a plugin contributes to the ``fanout`` command: a sub-command.

A plugin returns :class:`CliCommand` objects from :func:`fanout.hooks.specs.fanout_cli_commands`;
``fanout --help`` lists them next to the core's commands, so a command is there exactly when
its plugin is installed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CliCommand:
    """One ``fanout <name>`` sub-command.

    :param name: the sub-command's name (``migrate``); it must not be a core command's or
        another plugin's.
    :param help: the one line ``fanout --help`` shows.
    :param add_arguments: adds the command's options to its own ``argparse`` parser.
    :param run: runs the command with the parsed arguments and returns its exit code (0 for
        success, 1 for failure). Raising :class:`fanout.ConfigurationError` exits with 2 and
        any other :class:`fanout.FanoutError` with 1, each with its message on stderr, as for
        the core's commands.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
