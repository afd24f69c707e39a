"""The long chaos run: at least 30 SIGKILLs, ~200k rows in ~40 batches, one table.

python -m tests.chaos.long_run [--kills 30] [--seed N] [--rows 200000] [--files 40] [--lag]
    [--executor-kills N]

With ``--lag`` the PostgreSQL sink has ``on_failure="lag"`` and its server flaps (down for
whole runs, or stopped part way through one) while the driver is killed, also during the
catch-up; the input then updates earlier batches' keys so the upsert
table shows whether the missed batches came in order (``--rows / --files`` rows a batch).

With ``--executor-kills N`` the driver runs on ``local-cluster`` (two executor JVMs) with a
PostgreSQL append sink beside the others, and executor JVMs are SIGKILLed ``N`` times
(from the commit hooks before or after a partition commits, and from outside while a sink
writes), beside the ``--kills`` driver kills; the table counts kills per point.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

from tests.chaos.cluster_harness import ClusterReport, run_cluster_chaos
from tests.chaos.harness import ChaosReport, run_chaos
from tests.chaos.lag_harness import run_lag_chaos
from tests.chaos.services import embedded_servers, embedded_services


def main() -> int:
    """Run, print the kills and the per-sink table; exit 1 unless every sink is exact."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--lag", action="store_true", help="PostgreSQL lags alone and flaps")
    parser.add_argument("--executor-kills", type=int, default=0, help="on local-cluster")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fanout-chaos-") as tmp:
        root = Path(tmp)
        if args.executor_kills:
            with embedded_services(root / "services") as (pg_url, bootstrap):
                cluster = run_cluster_chaos(
                    root / "work",
                    pg_url=pg_url,
                    bootstrap=bootstrap,
                    seed=args.seed,
                    executor_kills=args.executor_kills,
                    driver_kills=args.kills,
                    files=args.files,
                    rows_per_file=args.rows // args.files,
                    say=lambda line: print(line, flush=True),
                )
            return _print(cluster)
        if args.lag:
            with embedded_servers(root / "services") as (server, pg_url, bootstrap):
                report = run_lag_chaos(
                    root / "work",
                    server=server,
                    pg_url=pg_url,
                    bootstrap=bootstrap,
                    seed=args.seed,
                    kills=args.kills,
                    files=args.files,
                    step=max(1, args.rows // args.files // 2),
                    say=lambda line: print(line, flush=True),
                )
            return _print(report)
        with embedded_services(root / "services") as (pg_url, bootstrap):
            report = run_chaos(
                root / "work",
                pg_url=pg_url,
                bootstrap=bootstrap,
                seed=args.seed,
                kills=args.kills,
                files=args.files,
                rows_per_file=args.rows // args.files,
                say=lambda line: print(line, flush=True),
            )
    return _print(report)


def _print(report: ChaosReport) -> int:
    print()
    kills, runs = len(report.kills), report.runs
    print(f"seed {report.seed}: {kills} kills, {runs} driver runs, {report.seconds:.0f} s")
    if isinstance(report, ClusterReport):
        print(report.point_table())
    print(report.table())
    exact, verdict = report.verdict()
    print(verdict)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
