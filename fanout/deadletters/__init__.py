"""Dead letters: the rows a sink's route or target refuses, kept instead of failing the batch.

Layer 2: imports the contract, :mod:`fanout.delta_tables` and errors.
"""
