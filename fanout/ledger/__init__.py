"""The ledger: which sink committed which batch, in a Delta table fanout owns."""
