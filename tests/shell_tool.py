"""The function tool the end-to-end tests offer the model: `exec_command`, an agent's
shell, in the strict form the openai SDK sends (the sim engine's script calls it)."""

from __future__ import annotations

from typing import Any

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]
