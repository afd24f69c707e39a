"""``fanout status`` and ``fanout recover`` need no pandas (not a dependency of fanout):
their modules do not import it, and both commands run, and say the same, in a process
where it cannot be imported. With pandas installed, pyarrow itself imports it when it
converts (``pa.table`` of a reader, a zoned timestamp's ``to_pylist``): that is pyarrow's
probe of an optional library, not a need of the commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry

RUN = """
import sys

class NoPandas:
    '''pandas not installed: its import fails as a missing module's does.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoPandas())
from fanout.app.cli import main

code = main(sys.argv[1:])
print(f"exit {code}, pandas imported: {'pandas' in sys.modules}")
"""

IMPORTS = """
import sys
import fanout.app.cli, fanout.app.recover, fanout.app.recover_sinks, fanout.app.standing
import fanout.app.status
print(sorted(m for m in sys.modules if m.split(".")[0] == "pandas"))
"""


def _ledger(path: Path) -> str:
    """A ledger holding batches 0-2 of sink ``pg`` of pipeline ``p``, 3 rows each."""
    ledger = DeltaLedger(str(path))
    ledger.open()
    for batch in range(3):
        ledger.mark_committed(LedgerEntry("p", "pg", batch, "committed", rows=3, query_id="q"))
    return str(path)


def _run(code: str, *args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_status_and_recover_modules_import_no_pandas() -> None:
    assert _run(IMPORTS) == ["[]"]


def test_status_and_recover_run_where_pandas_cannot_be_imported(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "ledger")
    assert _run(RUN, "status", "--ledger", ledger) == [
        "pipeline  sink  last batch  rows (total)  failed  last commit (UTC)",
        "--------  ----  ----------  ------------  ------  -----------------",
        "p         pg    2           9             0       -",
        "",
        "pipeline 'p': no write mark with its time yet (never ran, no sink committed a batch, "
        "or its marks",
        "  carry no time)",
        "exit 0, pandas imported: False",
    ]
    said = _run(RUN, "recover", "--ledger", ledger, "--pipeline", "p")
    assert said[1:4] == [
        "pipeline 'p': last committed batch per sink",
        "  pg: batch 2, query id q, source offsets not recorded",
        "Resume after batch 2: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
    ]
    assert said[-1] == "exit 0, pandas imported: False"
    assert said[-2].startswith("Recorded in the ledger as report ")  # its one write
