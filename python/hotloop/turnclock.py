"""Where a turn's time to first token goes inside the server: one turn's clock, stamped
as the turn passes each stage, and its phases.

A transport starts a clock when a request is complete in the server (a WebSocket frame
in uvicorn's protocol, an HTTP body read), stamps it when the app reads the request and
when the engine work starts, and sets `TURN_CLOCK` for the task that consumes the
engine's stream; an engine that writes to a socket stamps the request's write and each
read of ids, the transport the hand-over of each batch, until the frame with the first
delta is written. Its phases, in order (wall time; they add up to the server's share of
the first token, plus the upstream's own time):

- `queued`: the frame complete in the protocol -> the app reads it (other callbacks held
  the event loop). Not measured over HTTP (uvicorn reads the body for the app).
- `prepare`: read -> engine work starts (parse, cache lookup, render, in a thread for a
  large one, the `response.created` events, the engine task's first step).
- `upstream_write`: engine work starts -> the request is written to the upstream's
  socket (the connection pool, the body). An upstream engine only.
- `upstream`: written (or started) -> the ids that carry the first delta are read from
  the socket: the upstream's own time to first token, and its format's header tokens.
- `handover`: those ids read -> the transport has them (the engine task's wake-up: the
  event loop runs what is ahead of it first).
- `delta_out`: the transport has them -> the frame holding the first delta is written.

This module owns the clock and the names of its phases; it records nothing itself
(`hotloop.metrics.TurnPhases` does) and touches no socket.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

PHASES = ("queued", "prepare", "upstream_write", "upstream", "handover", "delta_out")


class TurnClock:
    """One turn's stamps, `time.perf_counter_ns()`; 0: not (yet) stamped."""

    __slots__ = ("arrived_ns", "handed_ns", "read_ns", "received_ns", "started_ns", "written_ns")

    def __init__(self, received_ns: int, read_ns: int | None = None) -> None:
        self.received_ns = received_ns
        self.read_ns = received_ns if read_ns is None else read_ns
        self.started_ns = 0
        self.written_ns = 0
        self.arrived_ns = 0
        self.handed_ns = 0

    def start(self) -> None:
        """The engine work starts."""
        self.started_ns = time.perf_counter_ns()

    def written(self) -> None:
        """The request is written to the upstream's socket."""
        self.written_ns = time.perf_counter_ns()

    def arrived(self) -> None:
        """Ids were read from the upstream's socket."""
        self.arrived_ns = time.perf_counter_ns()

    def handed(self) -> None:
        """The transport has a batch of ids."""
        self.handed_ns = time.perf_counter_ns()

    def phases(self, out_ns: int) -> dict[str, float]:
        """The phases in seconds, the first delta written at `out_ns`; a phase whose
        stamps are missing (no upstream socket, no queue to measure) is left out."""
        upstream_from = self.written_ns or self.started_ns
        arrived = self.arrived_ns or self.handed_ns
        found = {
            "queued": self.read_ns - self.received_ns,
            "prepare": self.started_ns - self.read_ns,
            "upstream_write": self.written_ns - self.started_ns if self.written_ns else -1,
            "upstream": arrived - upstream_from,
            "handover": self.handed_ns - self.arrived_ns if self.arrived_ns else -1,
            "delta_out": out_ns - self.handed_ns,
        }
        if self.read_ns == self.received_ns:
            del found["queued"]
        return {name: ns / 1e9 for name, ns in found.items() if ns >= 0}


TURN_CLOCK: ContextVar[TurnClock | None] = ContextVar("turn_clock", default=None)
"""The clock of the turn whose engine stream the current task consumes, until its first
delta is written (then None): set by the transport before it starts the engine's
stream, read by an engine that stamps its socket's write and reads. A context variable
for the reason `ENGINE_CACHED` is one."""
