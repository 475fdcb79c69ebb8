"""`hotloop bench`: the evidence that a WebSocket agent loop spends almost no time in the
API server, however long the conversation.

This package owns the benchmark side only: realistic coding-agent rollouts (`rollout`),
clients that replay them against a live server in each transport mode (`agent`), server
CPU accounting from /proc (`proc`), the re-render-everything peer (`peer`, reading items'
text with `items`), the concurrency driver (`load`), and the JSON/PNG reports (`report`).
It never imports the server's internals: everything it measures goes over a socket.
"""

MODES = ("http_full", "http_previous", "websocket", "long_running")
"""The client modes an agent replays a rollout in (`agent`), as the command line names
them (`command`): here, so that neither imports the other."""
