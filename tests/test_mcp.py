"""Remote MCP tools run by the server inside one response (docs/tools.md, "MCP tools"):
the tests' MCP server (tests/mcp_server.py, the `mcp` package's server over streamable
HTTP on loopback), the sim engine scripted to call its tools, the openai SDK over
WebSocket, every frame validated strictly with the SDK's models (the server fixture
and `validate` here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hotloop.config import ServerConfig
from hotloop.engines.llama import LlamaConfig, LlamaEngine
from hotloop.engines.sim import SimScript, SimTurn
from hotloop.transport import App
from mcp_server import NOTES, SEEN_HEADERS, SEEN_PATHS, hostile_server, mcp_server
from openai import OpenAI
from openai.types.responses import Response
from openai.types.responses.response_output_item import McpCall
from sdk_events import final, validate
from servers import hotloop_server, serving, sim_engine

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
SECRET = "sk-mcp-secret-never-shown"


@pytest.fixture(scope="module")
def mcp_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    sandbox = tmp_path_factory.mktemp("sandbox")
    (sandbox / "notes.txt").write_text("the answer is 42")
    with mcp_server(sandbox) as url:
        yield url


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "tests",
        "server_url": url,
        "headers": {"X-Api-Key": SECRET},
        "require_approval": "never",
        **fields,
    }


def script(*calls: tuple[str, str]) -> SimScript:
    """The model calls each tool in turn, then answers."""
    return SimScript(turns=(*(SimTurn(calls=(call,)) for call in calls), SimTurn(text="All done.")))


def run(base: str, tools: list[dict[str, Any]], **request: Any) -> list[dict[str, Any]]:
    """One response over the SDK's WebSocket connection: its frames, each validated."""
    client = OpenAI(base_url=base + "/v1", api_key="sk-test")
    frames: list[dict[str, Any]] = []
    with client.responses.connect() as conn:
        conn.response.create(model="sim", input="go", tools=tools, store=False, **request)
        while True:
            raw = conn.recv_bytes()
            frames.append(event := validate(raw))
            conn.parse_event(raw)  # the SDK's own types
            if event["type"] in TERMINAL or event["type"] == "error":
                return frames


def kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["type"] for frame in frames]


def test_calls_run_inside_one_response_and_the_model_goes_on(mcp_url: str) -> None:
    calls = (("add", '{"a": 2, "b": 40}'), ("read_file", '{"path": "notes.txt"}'))
    with hotloop_server(script(*calls), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        frames = run(base, [mcp_tool(mcp_url)])
    final = frames[-1]["response"]
    assert final["status"] == "completed", final
    output = final["output"]
    assert [item["type"] for item in output] == [
        "mcp_list_tools",
        "mcp_call",
        "mcp_call",
        "message",
    ]
    listing = output[0]
    assert {"add", "read_file", "sleep", "fail", "megabyte"} <= {
        t["name"] for t in listing["tools"]
    }
    assert [(item["name"], item["output"], item["status"]) for item in output[1:3]] == [
        ("add", "42.0", "completed"),
        ("read_file", "the answer is 42", "completed"),
    ]
    assert output[1]["server_label"] == "tests" and output[1]["error"] is None
    # The SDK's order: listed, then per call: added, in progress, arguments, completed, done.
    assert kinds(frames)[2:6] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
    ]
    first_call = [
        f
        for f in frames
        if f.get("item_id") == output[1]["id"] or (f.get("item") or {}).get("id") == output[1]["id"]
    ]
    # One delta per engine batch: as many as the engine's batching makes.
    deltas = kinds(first_call).count("response.mcp_call_arguments.delta")
    assert deltas >= 1
    assert kinds(first_call) == [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        *["response.mcp_call_arguments.delta"] * deltas,
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    assert {f["output_index"] for f in first_call} == {1}
    # The credentials never reach the wire: the echoed tool shows them redacted.
    everything = orjson.dumps(frames).decode()
    assert SECRET not in everything
    echoed = next(t for t in final["tools"] if t["type"] == "mcp")
    assert echoed["headers"] == {"X-Api-Key": "[redacted]"}
    # Two model turns after the first, one engine pass each: usage adds them up.
    assert final["usage"]["output_tokens"] > 0


def test_failures_are_call_errors_the_model_goes_on_from(mcp_url: str) -> None:
    calls = (("fail", "{}"), ("sleep", '{"seconds": 30}'), ("megabyte", "{}"))
    with hotloop_server(
        script(*calls), api_keys=("sk-test",), mcp_allow=(mcp_url,), mcp_call_timeout=1.0
    ) as base:
        frames = run(base, [mcp_tool(mcp_url)])
    final = frames[-1]["response"]
    assert final["status"] == "completed", final
    errors = [item["error"] for item in final["output"] if item["type"] == "mcp_call"]
    assert [error["type"] for error in errors] == [
        "mcp_tool_execution_error",
        "http_error",
        "http_error",
    ]
    assert [error.get("code") for error in errors[1:]] == [504, 413]
    assert "response.mcp_call.failed" in kinds(frames)
    assert final["output"][-1]["type"] == "message"


def test_max_tool_calls_bounds_the_loop(mcp_url: str) -> None:
    calls = (("add", '{"a": 1, "b": 1}'),) * 3
    with hotloop_server(script(*calls), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        frames = run(base, [mcp_tool(mcp_url)], max_tool_calls=1)
    final = frames[-1]["response"]
    mcp_calls = [item for item in final["output"] if item["type"] == "mcp_call"]
    # The second call is refused with an error, and the response ends there.
    assert [item["status"] for item in mcp_calls] == ["completed", "failed"]
    assert "max_tool_calls" in mcp_calls[1]["error"]["message"]
    assert final["status"] == "completed"


def test_a_server_not_allowed_is_refused_before_any_connection(mcp_url: str) -> None:
    with hotloop_server(script(("add", "{}")), api_keys=("sk-test",)) as base:
        frames = run(base, [mcp_tool(mcp_url)])
    assert frames[-1]["type"] == "error"
    error = frames[-1]["error"]
    assert error["code"] == "mcp_server_not_allowed"
    assert "private" in error["message"] and error["param"] == "tools[0].server_url"


def test_a_tool_name_that_collides_with_a_function_tool_is_refused(mcp_url: str) -> None:
    function = {"type": "function", "name": "add", "parameters": {"type": "object"}}
    with hotloop_server(script(("add", "{}")), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        frames = run(base, [function, mcp_tool(mcp_url)])
    assert frames[-1]["error"]["code"] == "mcp_tool_conflict"


def test_allowed_tools_limits_what_is_offered(mcp_url: str) -> None:
    function = {"type": "function", "name": "add", "parameters": {"type": "object"}}
    tool = mcp_tool(mcp_url, allowed_tools=["read_file"])
    with hotloop_server(script(("add", "{}")), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        frames = run(base, [function, tool])
    final = frames[-1]["response"]
    assert [t["name"] for t in final["output"][0]["tools"]] == ["read_file"]
    # `add` is the client's function: its call ends the response for the client.
    assert final["output"][-1]["type"] == "function_call"


def http_app(data_dir: Path, script: SimScript, **config: Any) -> Any:
    settings = ServerConfig(engine="sim", api_keys=("sk-test",), data_dir=str(data_dir), **config)
    return App.from_config(settings, sim_engine(script))


def test_http_json_and_sse_with_a_stored_response_shown_redacted(
    mcp_url: str, tmp_path: Path
) -> None:
    app = http_app(tmp_path, script(("add", '{"a": 1, "b": 2}')), mcp_allow=(mcp_url,))
    with serving(app) as base:
        client = OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
        raw = client.responses.with_raw_response.create(
            model="sim", input="go", tools=[mcp_tool(mcp_url)], store=True
        )
        body = raw.http_response.content
        created = Response.model_validate_json(body, strict=True)
        assert [item.type for item in created.output] == ["mcp_list_tools", "mcp_call", "message"]
        call = created.output[1]
        assert isinstance(call, McpCall) and call.output == "3.0"
        stored = client.responses.with_raw_response.retrieve(created.id).http_response.content
        assert SECRET not in stored.decode() and SECRET not in body.decode()
        assert Response.model_validate_json(stored, strict=True).output == created.output
        # The chain goes on from the response, its MCP calls in the cached tokens.
        after = client.responses.create(
            model="sim", input="again", previous_response_id=created.id, store=False
        )
        assert after.status == "completed"

        with client.responses.with_streaming_response.create(
            model="sim", input="go", tools=[mcp_tool(mcp_url)], store=False, stream=True
        ) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    events = [validate(line.removeprefix("data: ")) for line in lines]
    assert events[-1]["type"] == "response.completed"
    assert "response.mcp_call.completed" in kinds(events)
    # Another process rebuilds the chain from the store: its MCP items render as the
    # calls and outputs the model saw.
    with serving(http_app(tmp_path, script(("add", "{}")), mcp_allow=(mcp_url,))) as base:
        client = OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
        rebuilt = client.responses.create(
            model="sim", input="again", previous_response_id=created.id, store=False
        )
    assert rebuilt.status == "completed"


@pytest.mark.parametrize("path", ["/hang", "/malformed", "/endless", "/redirect"])
def test_a_hostile_server_is_a_listing_error_and_the_response_goes_on(path: str) -> None:
    with hostile_server() as hostile:
        url = hostile + path
        # The endless event is cut at the listing's size bound, the hang at the timeout.
        with hotloop_server(
            SimScript(text="No tools."),
            api_keys=("sk-test",),
            mcp_allow=(url,),
            mcp_call_timeout=1.0,
            mcp_max_listing_bytes=100_000,
        ) as base:
            frames = run(base, [mcp_tool(url)])
    final = frames[-1]["response"]
    assert final["status"] == "completed", final
    listing = final["output"][0]
    assert listing["type"] == "mcp_list_tools" and listing["tools"] == []
    assert listing["error"], listing
    if path == "/redirect":
        # Refused by the transport, not followed: the location is named, not reached.
        assert "127.0.0.2" in listing["error"], listing
    assert "response.mcp_list_tools.failed" in kinds(frames)
    assert final["output"][-1]["content"][0]["text"] == "No tools."


def test_a_listing_above_its_bound_is_an_error(mcp_url: str) -> None:
    with hotloop_server(
        SimScript(text="No tools."),
        api_keys=("sk-test",),
        mcp_allow=(mcp_url,),
        mcp_max_listing_bytes=200,
    ) as base:
        frames = run(base, [mcp_tool(mcp_url)])
    listing = frames[-1]["response"]["output"][0]
    assert listing["tools"] == [] and "limit of 200" in listing["error"]


def test_headers_go_to_their_own_server_only(mcp_url: str) -> None:
    SEEN_HEADERS.clear()
    with hostile_server() as hostile:
        other = mcp_tool(hostile + "/malformed", server_label="other", headers=None)
        with hotloop_server(
            SimScript(text="Hi."), api_keys=("sk-test",), mcp_allow=(mcp_url, hostile)
        ) as base:
            frames = run(base, [mcp_tool(mcp_url), other])
    assert frames[-1]["response"]["status"] == "completed"
    assert SEEN_HEADERS, "the other server was listed"
    assert all(b"x-api-key" not in headers for headers in SEEN_HEADERS)
    assert SECRET.encode() not in b"".join(v for h in SEEN_HEADERS for v in h.values())


def test_a_hanging_mcp_server_never_stalls_another_connection(mcp_url: str) -> None:
    with hostile_server() as hostile:
        url = hostile + "/hang"
        with hotloop_server(
            SimScript(text="Hi."), api_keys=("sk-test",), mcp_allow=(url,), mcp_call_timeout=5
        ) as base:
            client = OpenAI(base_url=base + "/v1", api_key="sk-test")
            with client.responses.connect() as stalled, client.responses.connect() as other:
                stalled.response.create(model="sim", input="go", tools=[mcp_tool(url)], store=False)
                other.response.create(model="sim", input="hello", store=False)
                # The other connection's turn ends while the listing hangs; then the
                # listing times out and the stalled response goes on without its tools.
                assert final(other).status == "completed"
                stalled_final = final(stalled)
    assert stalled_final.status == "completed"
    listing = stalled_final.output[0]
    assert listing.type == "mcp_list_tools" and "longer than 5 s" in (listing.error or "")


def approval_turn(
    conn: Any, request: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One response on an SDK connection: its frames and its final Response."""
    conn.response.create(model="sim", store=False, **request)
    frames: list[dict[str, Any]] = []
    while True:
        raw = conn.recv_bytes()
        frames.append(event := validate(raw))
        conn.parse_event(raw)
        if event["type"] in TERMINAL or event["type"] == "error":
            return frames, event.get("response") or event


def test_an_approved_call_runs_and_a_declined_one_does_not(mcp_url: str) -> None:
    calls = (("add", '{"a": 20, "b": 22}'), ("add", '{"a": 1, "b": 1}'))
    tool = mcp_tool(mcp_url, require_approval="always")
    with hotloop_server(
        script(*calls), api_keys=("sk-test", "sk-other"), mcp_allow=(mcp_url,)
    ) as base:
        client = OpenAI(base_url=base + "/v1", api_key="sk-test")
        with client.responses.connect() as conn:
            frames, first = approval_turn(conn, {"input": "go", "tools": [tool]})
            assert first["status"] == "completed"
            request = first["output"][-1]
            assert request["type"] == "mcp_approval_request" and request["name"] == "add"
            assert "response.mcp_call_arguments.delta" not in kinds(frames)
            # Another key cannot answer it.
            other = OpenAI(base_url=base + "/v1", api_key="sk-other")
            with other.responses.connect() as stranger:
                answer = {
                    "type": "mcp_approval_response",
                    "approval_request_id": request["id"],
                    "approve": True,
                }
                _, refused = approval_turn(stranger, {"input": [answer], "tools": [tool]})
            assert refused["error"]["code"] == "mcp_approval_not_found"
            # Approved: the call runs first, then the model goes on (and asks again).
            approve = {"input": [answer], "tools": [tool], "previous_response_id": first["id"]}
            frames, second = approval_turn(conn, approve)
            assert second["status"] == "completed", second
            # The listing is the chain's (no item again): the approved call comes first.
            ran = second["output"][0]
            assert ran["type"] == "mcp_call" and ran["output"] == "42.0"
            assert ran["approval_request_id"] == request["id"]
            asked = second["output"][-1]
            assert asked["type"] == "mcp_approval_request"
            # Declined: no call, the model answers.
            decline = {**answer, "approval_request_id": asked["id"], "approve": False}
            _, third = approval_turn(
                conn, {"input": [decline], "tools": [tool], "previous_response_id": second["id"]}
            )
            assert [item["type"] for item in third["output"]] == ["message"]
            # An answered request cannot be answered again.
            _, again = approval_turn(conn, {**approve, "previous_response_id": first["id"]})
            assert again["error"]["code"] == "mcp_approval_not_found"


def test_per_tool_approval(mcp_url: str) -> None:
    never = {"never": {"tool_names": ["read_file"]}}
    tool = mcp_tool(mcp_url, require_approval=never)
    calls = (("read_file", '{"path": "notes.txt"}'), ("add", "{}"))
    with hotloop_server(script(*calls), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        frames = run(base, [tool])
    output = frames[-1]["response"]["output"]
    assert [item["type"] for item in output] == [
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
    ]


@pytest.mark.model
def test_smollm2_is_offered_the_listed_tools(mcp_url: str) -> None:
    """The real model (the embedded llama engine): the listed tools render through its
    chat template and a turn runs on them. SmolLM2 does not call them (it answers in
    text, `tool_choice: required` or not), so the loop itself is the sim's to test."""
    engine = LlamaEngine(LlamaConfig(n_ctx=4096, max_sequences=2, n_threads=1))
    app = App(engine, ServerConfig(mcp_allow=(mcp_url,), api_keys=("sk-test",)))
    with serving(app) as base:
        client = OpenAI(base_url=base + "/v1", api_key="sk-test")
        with client.responses.connect() as conn:
            conn.response.create(
                model="smollm2",
                input="What is 2 plus 40? Use the add tool.",
                tools=[mcp_tool(mcp_url, allowed_tools=["add"])],
                store=False,
                temperature=0,
                max_output_tokens=32,
            )
            response = final(conn)
    assert response.status in ("completed", "incomplete")
    listing = response.output[0]
    assert listing.type == "mcp_list_tools" and [t.name for t in listing.tools] == ["add"]
    assert response.usage is not None and response.usage.input_tokens > 100


def test_a_listing_is_reused_along_the_chain_while_the_tool_is_the_same(mcp_url: str) -> None:
    # The first response runs one call and ends at its bound; the second runs the third.
    calls = (("add", '{"a": 1, "b": 2}'), ("add", "{}"), ("add", '{"a": 3, "b": 4}'))
    tool = mcp_tool(mcp_url)
    with hotloop_server(script(*calls), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        client = OpenAI(base_url=base + "/v1", api_key="sk-test")
        with client.responses.connect() as conn:
            _, first = approval_turn(conn, {"input": "go", "tools": [tool], "max_tool_calls": 1})
            assert [item["type"] for item in first["output"]][:2] == ["mcp_list_tools", "mcp_call"]
            follow = {"input": "more", "tools": [tool], "previous_response_id": first["id"]}
            _, second = approval_turn(conn, follow)
            # Listed once per chain: the tools are offered, no listing item again.
            assert second["status"] == "completed", second
            assert second["output"][0]["type"] == "mcp_call"
            assert second["output"][0]["output"] == "7.0"
            # Another definition (other credentials here) is listed again.
            changed = {**follow, "tools": [{**tool, "headers": {"X-Api-Key": "other"}}]}
            _, third = approval_turn(conn, {**changed, "previous_response_id": second["id"]})
            assert third["output"][0]["type"] == "mcp_list_tools"


def test_no_call_starts_after_the_responses_mcp_time(mcp_url: str) -> None:
    with hotloop_server(
        script(("add", "{}")), api_keys=("sk-test",), mcp_allow=(mcp_url,), mcp_response_time=0
    ) as base:
        frames = run(base, [mcp_tool(mcp_url)])
    final_ = frames[-1]["response"]
    call = final_["output"][1]
    assert call["status"] == "failed" and call["error"]["code"] == 504
    assert final_["status"] == "completed" and final_["output"][-1] is call


def test_mcp_and_client_function_tools_in_one_request(mcp_url: str) -> None:
    function = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}
    calls = (("add", '{"a": 1, "b": 1}'), ("exec_command", "{}"))
    with hotloop_server(script(*calls), api_keys=("sk-test",), mcp_allow=(mcp_url,)) as base:
        frames = run(base, [mcp_tool(mcp_url), function])
    final_ = frames[-1]["response"]
    # The MCP call ran in the response; the client's call ends it for the client.
    assert [item["type"] for item in final_["output"]] == [
        "mcp_list_tools",
        "mcp_call",
        "function_call",
    ]
    assert final_["output"][1]["output"] == "2.0"


def test_a_request_names_at_most_mcp_max_servers_servers(mcp_url: str) -> None:
    """One request could name 512 `mcp` tools, all listed at once (969 connections):
    past `--mcp-max-servers` it is refused before any connection."""
    tools = [mcp_tool(mcp_url, server_label=f"s{n}") for n in range(3)]
    with hotloop_server(
        SimScript(text="Hi."), api_keys=("sk-test",), mcp_allow=(mcp_url,), mcp_max_servers=2
    ) as base:
        frames = run(base, tools)
    error = frames[-1]["error"]
    assert error["code"] == "array_above_max_length" and error["param"] == "tools"
    assert "--mcp-max-servers" in error["message"]


def test_listings_past_the_keys_bound_are_error_items(mcp_url: str) -> None:
    """A listing takes a place among the key's running calls: past the bound, its item
    is the error and the request goes on."""
    tools = [
        mcp_tool(mcp_url, server_label=f"s{n}", allowed_tools=[f"{name}"])
        for n, name in enumerate(("add", "fail"))
    ]
    with hotloop_server(
        SimScript(text="Hi."),
        api_keys=("sk-test",),
        mcp_allow=(mcp_url,),
        mcp_max_calls_per_key=1,
    ) as base:
        frames = run(base, tools)
    final_ = frames[-1]["response"]
    assert final_["status"] == "completed", final_
    listings = final_["output"][:2]
    assert [listing["type"] for listing in listings] == ["mcp_list_tools"] * 2
    # Listed together: the first counts before the second starts.
    assert listings[0]["error"] is None and listings[0]["tools"]
    assert listings[1]["tools"] == [] and "of this API key" in listings[1]["error"]


@pytest.mark.parametrize("path", ["/mcp/../admin/mcp", "/mcp/%2e%2e/admin/mcp"])
def test_a_server_url_cannot_leave_its_allowed_prefix(path: str) -> None:
    """With `http://H/mcp/` allowed, `http://H/mcp/../admin/mcp` reached `/admin/mcp`
    (the client removed the dot segments after the check): the URL is checked as it is
    requested, and refused before any connection."""
    SEEN_PATHS.clear()
    with hostile_server() as hostile:
        with hotloop_server(
            SimScript(text="Hi."), api_keys=("sk-test",), mcp_allow=(hostile + "/mcp/",)
        ) as base:
            frames = run(base, [mcp_tool(hostile + path)])
    assert frames[-1]["type"] == "error", frames[-1]
    assert frames[-1]["error"]["code"] == "mcp_server_not_allowed"
    assert SEEN_PATHS == []


def test_host_and_hop_by_hop_headers_are_not_sent() -> None:
    """A `Host` in an `mcp` tool's headers asked an allowed address for another virtual
    host: it is dropped, with the hop-by-hop headers (and those `Connection` names)."""
    SEEN_HEADERS.clear()
    headers = {
        "Host": "internal.example",
        "Connection": "X-Hop",
        "X-Hop": "1",
        "Keep-Alive": "timeout=600",
        "Transfer-Encoding": "chunked",
        "X-Api-Key": SECRET,
    }
    with hostile_server() as hostile:
        url = hostile + "/malformed"
        with hotloop_server(SimScript(text="Hi."), api_keys=("sk-test",), mcp_allow=(url,)) as base:
            frames = run(base, [mcp_tool(url, headers=headers)])
    assert frames[-1]["response"]["status"] == "completed"
    assert SEEN_HEADERS
    for seen in SEEN_HEADERS:
        assert seen[b"host"] == hostile.removeprefix("http://").encode()
        assert seen[b"x-api-key"] == SECRET.encode()
        assert not {b"x-hop", b"keep-alive", b"transfer-encoding"} & set(seen)


@pytest.mark.parametrize("path", ["/bad-schema", "/many"])
def test_a_listing_no_request_can_take_is_an_error_item(mcp_url: str, path: str) -> None:
    """A listed tool whose schema the core refuses, or 600 tools (a request holds 512),
    failed the whole request with 400: that listing is an error item, the others are
    offered and called."""
    with hostile_server() as hostile:
        url = hostile + path
        with hotloop_server(
            script(("add", '{"a": 1, "b": 2}')), api_keys=("sk-test",), mcp_allow=(url, mcp_url)
        ) as base:
            frames = run(base, [mcp_tool(url, server_label="bad"), mcp_tool(mcp_url)])
    final_ = frames[-1]["response"]
    assert final_["status"] == "completed", final_
    bad, good, call = final_["output"][:3]
    assert bad["type"] == "mcp_list_tools" and bad["tools"] == []
    assert "cannot be offered" in bad["error"], bad
    assert good["error"] is None and good["tools"]
    assert call["type"] == "mcp_call" and call["output"] == "3.0"
    assert "response.mcp_list_tools.failed" in kinds(frames)


def respond(base: str, transport: str, request: dict[str, Any]) -> dict[str, Any]:
    """One request over `transport`: its final Response, or its `error`."""
    if transport == "http":
        reply = httpx.post(
            base + "/v1/responses",
            json=request,
            headers={"Authorization": "Bearer sk-test"},
            timeout=60,
        )
        body: dict[str, Any] = reply.json()
        return body.get("error") or body
    client = OpenAI(base_url=base + "/v1", api_key="sk-test")
    with client.responses.connect() as conn:
        conn.response.create(**request)
        while True:
            event = validate(conn.recv_bytes())
            if event["type"] in TERMINAL:
                return dict(event["response"])
            if event["type"] == "error":
                return dict(event["error"])


@pytest.mark.parametrize("transport", ["http", "websocket"])
def test_an_approved_call_runs_only_in_a_request_that_is_accepted(
    mcp_url: str, tmp_path: Path, transport: str
) -> None:
    """An approval answered in a request then refused (400 `unknown_call_id`, a stray
    `function_call_output`) ran the call and used the approval up, so the corrected
    request was refused too: the call runs once, in the request that is accepted."""
    NOTES.clear()
    tool = mcp_tool(mcp_url, require_approval="always")
    app = http_app(tmp_path, script(("note", '{"text": "once"}')), mcp_allow=(mcp_url,))
    with serving(app) as base:
        request = {"model": "sim", "tools": [tool], "store": True}
        first = respond(base, transport, {**request, "input": "go"})
        asked = first["output"][-1]
        assert asked["type"] == "mcp_approval_request" and NOTES == []
        answer = {"type": "mcp_approval_response", "approval_request_id": asked["id"]}
        answer["approve"] = True
        stray = {"type": "function_call_output", "call_id": "call_nobody_made", "output": "x"}
        request["previous_response_id"] = first["id"]
        refused = respond(base, transport, {**request, "input": [answer, stray]})
        assert refused["code"] == "unknown_call_id", refused
        assert NOTES == []
        accepted = respond(base, transport, {**request, "input": [answer]})
    assert accepted["status"] == "completed", accepted
    ran = accepted["output"][0]
    assert ran["type"] == "mcp_call" and ran["output"] == "noted"
    assert ran["approval_request_id"] == asked["id"]
    assert NOTES == ["once"]
