"""The sink contract: what a plugin author implements (:class:`~fanout.contract.sink.Sink`) and
what a sink receives (:class:`~fanout.contract.batch.Batch`), with its options' declarations."""
