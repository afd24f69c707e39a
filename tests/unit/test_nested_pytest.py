"""A pytest started by a test runs through ``tests.nested_pytest.run_pytest``, with a
``--basetemp`` of its own: one started without it resets ``/tmp/pytest-of-<user>`` to
mode 0700, and an embedded PostgreSQL server another test starts at that moment (as a
system user of its own, when run as root) cannot reach its data directory (CI, stop 60:
``pg_ctl: could not access directory ...: Permission denied``)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.nested_pytest import REPO, run_pytest

STARTS_PYTEST = re.compile(r"""["']-m["'],\s*["']pytest["']|pytest\.main\(""")


def test_no_test_starts_a_pytest_of_its_own_but_through_run_pytest() -> None:
    files = [*REPO.glob("tests/**/*.py"), *REPO.glob("plugins/*/tests/**/*.py")]
    assert len(files) > 100
    starting = sorted(
        str(path.relative_to(REPO))
        for path in files
        if STARTS_PYTEST.search(path.read_text()) and path.name != "nested_pytest.py"
    )
    assert starting == [], starting


def test_the_inner_pytest_keeps_its_temporary_files_under_its_own_basetemp(
    tmp_path: Path,
) -> None:
    inner = tmp_path / "inner_test.py"
    inner.write_text("def test_where(tmp_path):\n    print('TMP=' + str(tmp_path))\n")
    done = run_pytest(tmp_path / "base", "-q", "-s", str(inner), timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    where = re.search(r"^TMP=(.*)$", done.stdout, re.M)
    assert where, done.stdout
    assert Path(where.group(1)).parent == tmp_path / "base"
