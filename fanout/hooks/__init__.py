"""Plugins: the hook specifications (``specs``), the registry of sink types (``registry``) and
the calling of observers (``caller``).

Layer 2: imports :mod:`fanout.contract` and :mod:`fanout.errors`.
"""
