"""Fixtures shared across test modules: real PostgreSQL and Redis servers
(`pg_server.py`, `redis_server.py`)."""

from pg_server import postgres_server
from redis_server import redis_server

__all__ = ["postgres_server", "redis_server"]
