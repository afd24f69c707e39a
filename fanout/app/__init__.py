"""What a user runs: the ``fanout`` command, pipeline files, status, recovery, the dev loop."""
