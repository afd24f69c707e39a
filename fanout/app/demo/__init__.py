"""``fanout demo``: a planned failure, a restart, and proof of no loss and no duplicate."""
