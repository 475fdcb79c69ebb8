"""Waiting for what the event loop was already told to run, by its ordering guarantee
rather than by a count of loop turns or the clock."""

from __future__ import annotations

import asyncio


async def scheduled_callbacks_ran() -> None:
    """Return once every callback scheduled on the running loop before this call has
    run. asyncio runs `call_soon` callbacks in the order they were scheduled, and every
    deferred step goes through it (a new task's first step, a task woken by a future, a
    `call_soon` of the code under test): a callback scheduled now runs after all of
    them. Not a wait for work those callbacks schedule in turn."""
    loop = asyncio.get_running_loop()
    ran = loop.create_future()
    loop.call_soon(ran.set_result, None)
    await ran
