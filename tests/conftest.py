"""Fixtures shared across test modules: real PostgreSQL and Redis servers
(`pg_server.py`, `redis_server.py`), and a server's store settings on each backend."""

from pg_server import postgres_server, store_settings
from redis_server import redis_server

__all__ = ["postgres_server", "redis_server", "store_settings"]
