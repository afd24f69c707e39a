"""Each built-in plugin's README holds its sink type's option table as declared
(``markdown_table(Sink.options)``), as the main README does (tests/unit/test_sink_options.py):
the plugin READMEs' tables were written by hand, without the type column, and drifted from
the declarations (``fanout plugins --options``) in both directions."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.contract.options import markdown_table, option_type_texts
from fanout.hooks.registry import load_registry

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
WITH_README = {"kafka": "fanout-kafka", "postgres": "fanout-postgres"}
"""The built-in sink types whose plugin has a README (fanout-delta's options are in the
main README only)."""


@pytest.mark.parametrize("type_name", sorted(WITH_README))
def test_a_plugin_readme_table_is_the_declaration(type_name: str) -> None:
    assert sorted(p.parent.name for p in PLUGINS.glob("*/README.md")) == sorted(
        WITH_README.values()
    )  # a new plugin README is checked too
    sink_class = load_registry().sink_types()[type_name].sink_class
    readme = (PLUGINS / WITH_README[type_name] / "README.md").read_text()
    assert markdown_table(sink_class.options, option_type_texts(sink_class)) in readme
    assert readme.count("| option |") == 1  # no other, older table of the options
