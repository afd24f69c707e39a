"""``fanout demo``: a planned failure, a restart, and proof of no loss and no duplicate
(``run``), the sinks read back (``checks``), its working directory (``workdir``) and the
servers it writes to (``services``).
"""
