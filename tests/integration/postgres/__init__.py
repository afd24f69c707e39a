"""Integration tests of the postgres sink against a real (embedded) PostgreSQL server."""
