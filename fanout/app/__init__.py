"""What a user runs: the ``fanout`` command (``cli``; each command's arguments and code in
``commands/``), pipeline files (``config``, ``runner``, ``validate``), ``status``,
``recover``, the dev loop (``dev``) and the demo (``demo/``).

Layer 7, the top: imports anything of the core; nothing imports it.
"""
