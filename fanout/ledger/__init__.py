"""The ledger: which sink committed which batch, in a Delta table fanout owns. ``entry`` is
the model and the protocol the dispatcher needs, ``delta`` the Delta table (the contract
over its ``delta_*`` collaborators), ``memory`` an in-memory double for tests and
benchmarks.

Layer 2: imports the contract, :mod:`fanout.delta_tables` and errors.
"""
