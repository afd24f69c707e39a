"""``fanout demo``: the end-to-end demo on embedded defaults (:mod:`fanout.app.demo`)."""

from __future__ import annotations

import argparse


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout demo`` to ``commands``."""
    demo = commands.add_parser(
        "demo",
        help="end-to-end demo: a failure mid-stream, a restart, "
        "and proof of no loss and no duplicate",
    )
    demo.add_argument(
        "--workdir",
        help="where to put input, tables and checkpoint (default: a new temporary directory)",
    )
    demo.add_argument("--rows", type=int, default=500, help="rows per input file (default 500)")
    demo.add_argument(
        "--batches", type=int, default=6, help="input files = micro-batches (default 6)"
    )
    demo.add_argument(
        "--postgres-url",
        help="write the PostgreSQL sink there (SQLAlchemy URL; ${VAR} allowed) instead of "
        "an embedded server",
    )
    demo.add_argument(
        "--kafka-bootstrap", help="write the Kafka sink there instead of an embedded broker"
    )
    demo.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the end-to-end demo on embedded defaults."""
    from fanout.app.demo.run import run_demo

    return run_demo(
        workdir=args.workdir,
        rows_per_file=args.rows,
        files=args.batches,
        postgres_url=args.postgres_url,
        kafka_bootstrap=args.kafka_bootstrap,
    )
