"""The sink contract: what a plugin author implements (:class:`~fanout.contract.sink.Sink`) and
what a sink receives (:class:`~fanout.contract.batch.Batch`), with the declarations of its
options and the rules for names.

Layer 1: imports only :mod:`fanout.errors`.
"""
