"""Sinks that commit one transaction per Spark partition: stable membership (``membership``)
and the refusal of non-deterministic partitioning (``determinism``).

Layer 3: imports the contract, routes and errors.
"""
