"""WebSocket mode's protocol logic, without I/O: the per-connection state machine
(`Connection`), its connection cache of checkpoints, and the protocol's error type."""

from hotloop.protocol.actions import (
    OFFLOAD_BYTES,
    Action,
    Cancel,
    Close,
    Finished,
    Generate,
    Later,
    McpCall,
    Observer,
    Persist,
    Render,
    TurnSegment,
    Wait,
    offloads,
)
from hotloop.protocol.connection import Connection, ConnectionLimits
from hotloop.protocol.connection_cache import CacheBudget, ConnectionCache
from hotloop.protocol.errors import ProtocolError
from hotloop.protocol.parsing import Parsed
from hotloop.protocol.queue_memory import QueueMemory

__all__ = [
    "OFFLOAD_BYTES",
    "Action",
    "CacheBudget",
    "Cancel",
    "Close",
    "Connection",
    "ConnectionCache",
    "ConnectionLimits",
    "Finished",
    "Generate",
    "Later",
    "McpCall",
    "Observer",
    "Parsed",
    "Persist",
    "ProtocolError",
    "QueueMemory",
    "Render",
    "TurnSegment",
    "Wait",
    "offloads",
]
