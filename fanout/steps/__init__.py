"""The steps of one micro-batch, in the order :meth:`fanout.fan_out.FanOut.process` takes them
(docs/architecture.md §2): ``context``, ``admit`` (the checkpoint ``guard``), ``plan``,
``persist``, then the routes (:mod:`fanout.routes.batch_routes`), ``write``, ``record``; all
share one :class:`~fanout.steps.state.BatchState`.

Layer 4: imports any layer below (contract, ledger, hooks, observe, routes...).
"""
