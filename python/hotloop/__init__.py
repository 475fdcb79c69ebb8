"""hotloop: a Responses-API server whose WebSocket mode keeps an agent's state warm."""

from hotloop._core import __version__

__all__ = ["__version__"]
