"""Reading Delta tables and their app transactions with delta-rs (``io``), and their
transaction retention against fanout's ids (``retention``); shared by the ledger and the
Delta sink.

Layer 1: imports only :mod:`fanout.errors` and, of its own layer, the walk over nested types
(:mod:`fanout.contract.nested_types`).
"""
