"""The ``fanout`` command's own commands, one module each: its arguments (``add_command``)
and what it runs (``cmd_*``), beside the helpers only it uses; :mod:`fanout.app.cli`
assembles them into the parser. Helpers several commands share: the output of ``--json``
(``output``), where an operator's command acts (``target``), the newest write mark it
prints first (``newest``)."""
