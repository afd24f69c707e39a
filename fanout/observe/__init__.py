"""Observability: structured redacted logs (``logs``), Prometheus metrics (``metrics``) and
secrets kept out of both (``secrets``).

Layer 2: imports the contract, hooks and errors.
"""
