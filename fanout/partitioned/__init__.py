"""Sinks that commit one transaction per Spark partition: stable membership, determinism
checks and the kit that runs such a sink's partitions on the executors."""
