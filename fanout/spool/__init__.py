"""The spool: the batches a lagging sink still needs, kept in Delta tables fanout owns
(docs/architecture.md §14).

Layer 2: imports :mod:`fanout.contract`, :mod:`fanout.delta_tables` and :mod:`fanout.errors`.
"""
