"""Fixtures shared across test modules: a real PostgreSQL server (`pg_server.py`)."""

from pg_server import postgres_server

__all__ = ["postgres_server"]
