"""Reading Delta tables and their app transactions with delta-rs, shared by the ledger and
the Delta sink."""
