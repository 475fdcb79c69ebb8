"""The laboratory: what measures and exercises the server, outside it. The server never
imports it, not even inside a function (tests/test_lab_boundary.py); it imports the
server. Its libraries are the `bench` extra.

`hotloop bench` (`command`, the `hotloop.commands` entry point `bench`) is the evidence
that a WebSocket agent loop spends almost no time in the API server, however long the
conversation: realistic coding-agent rollouts (`rollout`), clients that replay them
against a live server in each transport mode (`agent`), server CPU accounting from /proc
(`proc`), the re-render-everything peers (`peer`, `open_model`, reading items' text with
`items`) and the server that runs one on every turn (`baseline`: `hotloop bench serve
--baseline`), the concurrency driver (`load`), and the JSON/PNG reports (`report`).
Beside it: the fake vLLM and the simulated replicas (`fake_vllm`, `replica`), the
multi-node cluster on loopback (`cluster`, with `failover`'s agents), the attacks of the
abuse benchmark (`abuse`), the launchers of vLLM and llama-server that tests and
benchmarks run against (`vllm_server`, `llama_server`), the reference Hugging Face
template renderer (`hf_template`), and the in-process drivers of the server (`threaded`,
`scripted`).
"""

MODES = ("http_full", "http_previous", "websocket", "long_running", "chat")
"""The client modes an agent replays a rollout in (`agent`), as the command line names
them (`command`): here, so that neither imports the other."""
