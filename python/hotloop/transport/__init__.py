"""The I/O shell: a raw ASGI application that routes requests, upgrades WebSockets and
moves frames between sockets, the protocol state machine and the engine."""

from hotloop.transport.app import App

__all__ = ["App"]
