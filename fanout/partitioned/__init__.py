"""Sinks that commit one transaction per Spark partition: stable membership (``membership``),
the refusal of non-deterministic partitioning (``determinism``) and of a replay under
another route than its committed partitions' (``replay_route``).

Layer 3: imports the contract, routes and errors.
"""
