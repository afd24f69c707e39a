"""The operator commands' newest-mark lines (:mod:`fanout.app.activity`) set apart from
the rest of their output: tests of other lines assert those exactly as before, and the
newest-mark lines by what they say (their ages follow the clock)."""

from __future__ import annotations

import re
from typing import Any

FIRST = re.compile(
    r"^pipeline '[^']*'(?: looks (?:running|stopped): its newest mark is batch \d+ of epoch "
    r"\d+ by sink|: no write mark with its time yet)"
)


def split_newest(text: str) -> tuple[str, list[str]]:
    """``text`` without its newest-mark lines (a line :data:`FIRST` matches, and the lines
    ``fanout status`` wrapped it onto, indented two spaces; a blank line left before them
    alone goes too), and those lines, each unwrapped into one."""
    kept: list[str] = []
    found: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if FIRST.match(lines[i]):
            parts = [lines[i]]
            i += 1
            while not WHOLE.fullmatch(" ".join(parts)):
                assert i < len(lines) and lines[i].startswith("  "), (parts, text)
                parts.append(lines[i].strip())
                i += 1
            found.append(" ".join(parts))
            continue
        kept.append(lines[i])
        i += 1
    rest = "\n".join(kept)
    if found:  # the block's own blank line: "\n\n" before it, once
        rest = rest.replace("\n\n\n", "\n\n", 1) if "\n\n\n" in rest else rest
        if rest.endswith("\n\n"):
            rest = rest[:-1]
    return rest, found


def status_only(text: str, *, looks: str | None = None) -> str:
    """``fanout status``'s text without its newest-mark block, which must be there: one
    line per pipeline, each saying it ``looks`` so when given (``"running"``, ``"stopped"``,
    ``"none"``: no write mark)."""
    rest, found = split_newest(text)
    assert found, text
    if looks == "none":
        assert all("no write mark" in line for line in found), found
    elif looks is not None:
        assert all(f" looks {looks}: " in line for line in found), found
    return rest


WHOLE = re.compile(
    r"pipeline '[^']*' looks (?:running|stopped): its newest mark is batch \d+ of epoch \d+ by "
    r"sink '[^']*', [\dsmhd ]+ ago \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\); window [\dsmhd ]+ "
    r"\((?:\d+ x [\dsmhd ]+, the median gap between its latest batches, at least [\dsmhd ]+|"
    r"one batch of epoch \d+ only, no gap to judge by)\)"
    r"|pipeline '[^']*': no write mark with its time yet \(never ran, no sink committed a "
    r"batch, or its marks carry no time\)"
)
"""A whole newest-mark line: :func:`split_newest` takes the wrapped lines after a
:data:`FIRST` one only until the line is whole, so no line of the rest goes with it."""

WARNING = re.compile(r"^fanout: warning: pipeline '[^']*' looks running: ")


def without_newest(out: str, err: str = "") -> tuple[str, str]:
    """A command's ``out`` without its newest-mark lines (:func:`split_newest`) and its
    ``err`` without the warnings of a pipeline that looks running: for the tests of other
    lines, whose ledgers were all just written (so the pipeline looks running);
    ``tests/unit/test_newest_mark.py`` asserts those lines."""
    rest, _ = split_newest(out)
    kept = [line for line in err.split("\n") if not WARNING.match(line)]
    return rest, "\n".join(kept)


def readout(capsys: Any) -> Any:
    """``capsys.readouterr()`` with :func:`without_newest` applied (``.out``, ``.err``,
    and equal to an ``(out, err)`` tuple, as pytest's result is)."""
    from _pytest.capture import CaptureResult

    captured = capsys.readouterr()
    return CaptureResult(*without_newest(captured.out, captured.err))
