"""``python -m fanout``: the ``fanout`` command."""

from __future__ import annotations

from fanout.app.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
