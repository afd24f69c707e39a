"""``EmbeddedPostgres(durable=False)``: a real server without ``fsync`` and full page
writes, commits still synchronous; a durable server on the same data directory has them
back (``ALTER SYSTEM`` keeps its settings in the directory)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from fanout_postgres import EmbeddedPostgres

SETTINGS = ("fsync", "full_page_writes", "synchronous_commit")


def _settings(url: str) -> dict[str, str]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return {name: conn.execute(sa.text(f"SHOW {name}")).scalar_one() for name in SETTINGS}
    finally:
        engine.dispose()


def test_a_server_not_durable_skips_fsync_and_a_durable_one_after_it_does_not(
    tmp_path: Path,
) -> None:
    fast = EmbeddedPostgres(tmp_path / "data", durable=False)
    try:
        assert _settings(fast.start()) == {
            "fsync": "off", "full_page_writes": "off", "synchronous_commit": "on"
        }  # fmt: skip
    finally:
        fast.stop()
    durable = EmbeddedPostgres(tmp_path / "data", delete=True)
    try:
        assert _settings(durable.start()) == dict.fromkeys(SETTINGS, "on")
    finally:
        durable.stop()
