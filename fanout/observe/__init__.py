"""Observability: structured redacted logs, metrics, and secrets kept out of both."""
