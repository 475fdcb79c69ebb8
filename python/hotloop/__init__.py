"""hotloop: a Responses-API server whose WebSocket mode keeps an agent's state warm."""

from hotloop._core import __version__
from hotloop.tokenizer import IncrementalText, StreamDecoder, Tokenizer

__all__ = ["IncrementalText", "StreamDecoder", "Tokenizer", "__version__"]
