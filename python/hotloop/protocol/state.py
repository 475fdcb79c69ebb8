"""The states a response goes through, and every transition between them, in one
table: what the engine is doing for it (or what it waits for) from its first model turn
to its terminal event. As h11's `_state.py` does for its connection: everything that
changes a response's state is checked here, and a transition the table does not hold
is a bug that raises (`ImpossibleTransition`), never a silent combination of flags.

Plain data: the units that move a response (`response.py`, and the features beside it)
call `advance`; what each state means for the wire is theirs. A turn before its
response opens (its render, approved MCP calls) is a `Rendering`, not a state here.
"""

from __future__ import annotations

from enum import Enum


class State(Enum):
    """Where one response is in its life."""

    OPENED = "opened"
    """Rendered, its `response.created` decided, not yet handed to the engine."""
    PREFILLING = "prefilling"
    """A prewarm: the engine fills its cache with the prompt and samples nothing."""
    SAMPLING = "sampling"
    """The engine samples a model turn (the first, or one resumed after tool output)."""
    CUT_FOR_STEER = "cut_for_steer"
    """A steered response reached an item boundary: sampling stopped there, the engine's
    end commits the whole items only."""
    SUMMARIZING = "summarizing"
    """The engine writes a summary (`/responses/compact`, a `compaction_trigger` item,
    or a turn over its compaction threshold, which then samples on the summary)."""
    CALLING_MCP = "calling_mcp"
    """The model turn ended calling remote MCP tools: their calls run (`McpCall`)."""
    WAITING_FOR_TOOLS = "waiting_for_tools"
    """Long-running: the model turn ended calling client tools; the response holds its
    lane, open, until injected outputs answer them (or its idle timeout)."""
    ENDING = "ending"
    """Its terminal event waits for the store's commit (`Persist`)."""
    DONE = "done"
    """Its terminal event went out, or it ended without one (a `/responses/compact`
    answer, a client gone mid-turn)."""


# From each state, the states it may go to. Every way out of a running state to DONE or
# ENDING is the terminal event (cancel, interrupt, failure, the end of the output), or
# the client leaving (DONE without one).
TRANSITIONS: dict[State, frozenset[State]] = {
    State.OPENED: frozenset(
        {State.PREFILLING, State.SAMPLING, State.SUMMARIZING, State.ENDING, State.DONE}
    ),
    State.PREFILLING: frozenset({State.ENDING, State.DONE}),
    State.SAMPLING: frozenset(
        {
            State.CUT_FOR_STEER,
            State.CALLING_MCP,
            State.WAITING_FOR_TOOLS,
            State.ENDING,
            State.DONE,
        }
    ),
    # The boundary it stopped at may be the model's own end: the turn ends as any does.
    State.CUT_FOR_STEER: frozenset(
        {State.CALLING_MCP, State.WAITING_FOR_TOOLS, State.ENDING, State.DONE}
    ),
    State.SUMMARIZING: frozenset({State.SAMPLING, State.ENDING, State.DONE}),
    State.CALLING_MCP: frozenset({State.SAMPLING, State.ENDING, State.DONE}),
    State.WAITING_FOR_TOOLS: frozenset({State.SAMPLING, State.ENDING, State.DONE}),
    State.ENDING: frozenset({State.DONE}),
    State.DONE: frozenset(),
}

RUNNING = frozenset(
    {
        State.PREFILLING,
        State.SAMPLING,
        State.CUT_FOR_STEER,
        State.SUMMARIZING,
        State.CALLING_MCP,
        State.WAITING_FOR_TOOLS,
    }
)
"""States whose response a steer, an injection, an interrupt or a cancel can reach."""


class ImpossibleTransition(RuntimeError):
    """A response was asked to go where its state table does not lead: a bug in the
    protocol layer, never a client's doing."""

    def __init__(self, current: State, wanted: State) -> None:
        super().__init__(f"a response cannot go from {current.value} to {wanted.value}")
        self.current = current
        self.wanted = wanted


def advance(current: State, wanted: State) -> State:
    """`wanted`, when the table leads there from `current`; raises
    `ImpossibleTransition` otherwise."""
    if wanted not in TRANSITIONS[current]:
        raise ImpossibleTransition(current, wanted)
    return wanted
