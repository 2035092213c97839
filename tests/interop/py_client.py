"""The interop scenarios, driven by the official Python SDK client (`mcp`).

    py_client.py SCENARIO MODE OUT_JSON -- COMMAND [ARGS...]
    py_client.py SCENARIO MODE OUT_JSON -- http://HOST:PORT/PATH

Launches COMMAND as a stdio MCP server (run.py makes COMMAND either the server
itself, `mcp-retry run -- server` or `mcp-retry run --config` naming a remote
server), or connects to the URL with the SDK's own Streamable HTTP client,
and runs SCENARIO through an `mcp.Client`
connected with `mode=MODE` ("auto": probe `server/discover`, fall back to
`initialize`; "legacy": `initialize` only), and writes what the client saw to
OUT_JSON: `{"steps": [{"name", "value"}...], "cancelled": [...]}`. Each value
is the SDK's parsed result as wire JSON (or the error); run.py normalizes and
compares the direct and the proxied run step by step. Scenario arguments come
from the environment: INTEROP_ROOT (a fresh temp dir of this run) for
filesystem, MEMORY_FILE_PATH for memory.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Awaitable, Callable

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

# The roots this client offers; a fixed URI, so both runs offer the same.
ROOTS = [types.Root(uri="file:///interop/workspace", name="interop workspace")]


def dump(value: Any) -> Any:
    """The wire shape of an SDK object: what the peer sent (exclude_unset)."""
    if value is None:
        return None
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    return value


class Run:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.cancelled: list[dict[str, Any]] = []
        self.sampling_requests: list[Any] = []
        self.elicitation_requests: list[Any] = []
        self.roots_requests = 0
        self.log_messages: list[Any] = []
        self.notifications: list[Any] = []

    def record(self, name: str, value: Any, ok: bool = True) -> None:
        self.steps.append({"name": name, "value": value, "ok": ok})

    async def step(self, name: str, fn: Callable[[], Awaitable[Any]], expect: str = "result") -> Any:
        """Runs one request; records its result, or the JSON-RPC error it got.

        `expect` says what the direct run must see for the step to be
        meaningful: "result", "error" (a JSON-RPC error) or "any"."""
        try:
            result = await fn()
        except MCPError as e:
            self.record(name, {"error": dump(e.error)}, ok=expect in ("error", "any"))
            return None
        except Exception as e:  # the SDK refused the answer: a failure either way
            self.record(name, {"exception": f"{type(e).__name__}: {e}"}, ok=False)
            return None
        self.record(name, dump(result), ok=expect in ("result", "any"))
        return result

    # Callbacks for requests the server makes to the client.
    async def sampling(self, _ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.sampling_requests.append(dump(params))
        text = params.messages[-1].content.text if params.messages else ""
        # Numbered, as a model's answers differ from one request to the next.
        n = len(self.sampling_requests)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=f"sampled reply #{n} to: {text}"),
            model="interop-model",
            stop_reason="endTurn",
        )

    async def elicitation(self, _ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.elicitation_requests.append(dump(params))
        return types.ElicitResult(
            action="accept", content={"name": "Ada Lovelace", "check": True, "integer": 7, "number": 2.5}
        )

    async def list_roots(self, _ctx: Any) -> types.ListRootsResult:
        self.roots_requests += 1
        return types.ListRootsResult(roots=ROOTS)

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.log_messages.append(dump(params))

    async def message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.notifications.append({"exception": f"{type(message).__name__}: {message}"})
        else:
            self.notifications.append(dump(message))

    async def cancel_long_call(self, client: Client, tool: str, arguments: dict[str, Any], name: str) -> None:
        """Starts a long call, cancels it after its first progress notification,
        and records what the client saw: the call ends cancelled, without an
        answer. run.py checks on the wire that the server got
        `notifications/cancelled` for the call's id and never answered it."""
        first_progress = anyio.Event()
        progress: list[float] = []

        async def on_progress(p: float, _total: float | None, _message: str | None) -> None:
            progress.append(p)
            first_progress.set()

        outcome: dict[str, Any] = {"answered": False}
        started = time.monotonic()

        async def call() -> None:
            try:
                await client.call_tool(tool, arguments, progress_callback=on_progress)
                outcome["answered"] = True
            except MCPError as e:
                outcome["error"] = dump(e.error)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.move_on_after(10):
                await first_progress.wait()
            outcome["progress_seen_before_cancel"] = bool(progress)
            tg.cancel_scope.cancel()
        outcome["cancelled_promptly"] = time.monotonic() - started < 5
        self.record(name, outcome, ok=not outcome["answered"] and outcome["progress_seen_before_cancel"])
        # The tool's own progress token is the request id the SDK chose.
        self.cancelled.append({"tool": tool, "arguments": arguments})


async def everything(run: Run, c: Client) -> None:
    """server-everything: tools, sampling, elicitation, roots, resources,
    prompts, completion, logging, subscriptions, progress, cancellation."""
    # The server asks for the roots 350 ms after `initialized` and then logs
    # "Roots updated": wait for both before anything else, so the wire
    # traffic has the same order in both runs.
    with anyio.move_on_after(10):
        while run.roots_requests < 1 or not run.log_messages:
            await anyio.sleep(0.02)
    await run.step("ping", c.send_ping)
    await run.step("tools/list", c.list_tools)
    await run.step("tools/call echo", lambda: c.call_tool("echo", {"message": "hello, interop"}))
    await run.step("tools/call get-sum", lambda: c.call_tool("get-sum", {"a": 0.1, "b": 0.2}))
    await run.step("tools/call get-sum (large integers)", lambda: c.call_tool("get-sum", {"a": 9007199254740991, "b": 1}))
    await run.step(
        "tools/call echo (unicode)", lambda: c.call_tool("echo", {"message": "naïve café ☕ 𝄞 \u2028 \"quoted\""})
    )
    progress: list[Any] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append({"progress": p, "total": total, "message": message})

    await run.step(
        "tools/call trigger-long-running-operation (progress)",
        lambda: c.call_tool(
            "trigger-long-running-operation", {"duration": 0.6, "steps": 3}, progress_callback=on_progress
        ),
    )
    run.record("progress notifications of the long-running operation", progress, ok=len(progress) == 3)
    await run.step(
        "tools/call trigger-sampling-request",
        lambda: c.call_tool("trigger-sampling-request", {"prompt": "What is 2+2?", "maxTokens": 20}),
    )
    run.record("sampling/createMessage as the client received it", run.sampling_requests, ok=len(run.sampling_requests) == 1)
    await run.step("tools/call trigger-elicitation-request", lambda: c.call_tool("trigger-elicitation-request", {}))
    run.record("elicitation/create as the client received it", run.elicitation_requests, ok=len(run.elicitation_requests) == 1)
    await run.step("tools/call get-roots-list", lambda: c.call_tool("get-roots-list", {}))
    run.record("roots/list requests answered", run.roots_requests, ok=run.roots_requests >= 1)
    await run.step("tools/call get-tiny-image", lambda: c.call_tool("get-tiny-image", {}))
    await run.step(
        "tools/call get-structured-content",
        lambda: c.call_tool("get-structured-content", {"location": "Chicago"}),
    )
    await run.step(
        "tools/call get-annotated-message",
        lambda: c.call_tool("get-annotated-message", {"messageType": "success", "includeImage": True}),
    )
    await run.step("tools/call get-resource-links", lambda: c.call_tool("get-resource-links", {"count": 3}))
    await run.step(
        "tools/call with an unknown tool (error)", lambda: c.call_tool("no-such-tool", {}), expect="any"
    )
    await run.step(
        "tools/call get-sum with invalid arguments (error)",
        lambda: c.call_tool("get-sum", {"a": "one"}),
        expect="any",
    )
    await run.step("resources/list", c.list_resources)
    await run.step("resources/templates/list", c.list_resource_templates)
    await run.step(
        "resources/read static document",
        lambda: c.read_resource("demo://resource/static/document/features.md"),
    )
    await run.step("resources/read dynamic text", lambda: c.read_resource("demo://resource/dynamic/text/1"))
    await run.step("resources/read dynamic blob", lambda: c.read_resource("demo://resource/dynamic/blob/2"))
    await run.step(
        "resources/read unknown resource (error)",
        lambda: c.read_resource("demo://resource/dynamic/text/0"),
        expect="error",
    )
    await run.step(
        "resources/subscribe", lambda: c.subscribe_resource("demo://resource/static/document/features.md")
    )
    await run.step(
        "resources/unsubscribe", lambda: c.unsubscribe_resource("demo://resource/static/document/features.md")
    )
    await run.step("prompts/list", c.list_prompts)
    await run.step("prompts/get simple-prompt", lambda: c.get_prompt("simple-prompt"))
    await run.step(
        "prompts/get args-prompt", lambda: c.get_prompt("args-prompt", {"city": "Lisbon", "state": "Lisboa"})
    )
    await run.step("prompts/get resource-prompt", lambda: c.get_prompt("resource-prompt", {"resourceType": "Text", "resourceId": "3"}))
    await run.step(
        "completion/complete",
        lambda: c.complete(
            types.PromptReference(type="ref/prompt", name="completable-prompt"),
            {"name": "name", "value": "A"},
            {"department": "Engineering"},
        ),
    )
    await run.step("logging/setLevel", lambda: c.set_logging_level("debug"))
    await run.cancel_long_call(
        c, "trigger-long-running-operation", {"duration": 1.0, "steps": 5}, "cancellation of a long call"
    )
    await run.step("tools/call echo after the cancellation", lambda: c.call_tool("echo", {"message": "still here"}))
    # Let the cancelled operation run out on the server (1 s), so a late
    # answer to it would show in the wire log.
    await anyio.sleep(1.2)
    await run.step("ping at the end", c.send_ping)
    run.record("logging notifications received", run.log_messages)


async def filesystem(run: Run, c: Client) -> None:
    """server-filesystem in a fresh temp dir: write then read, and a revert."""
    root = os.environ["INTEROP_ROOT"]
    path = os.path.join(root, "notes", "todo.txt")
    await run.step("tools/list", c.list_tools)
    await run.step("tools/call list_allowed_directories", lambda: c.call_tool("list_allowed_directories", {}))
    await run.step(
        "tools/call create_directory", lambda: c.call_tool("create_directory", {"path": os.path.join(root, "notes")})
    )
    await run.step(
        "tools/call write_file", lambda: c.call_tool("write_file", {"path": path, "content": "first draft\n"})
    )
    await run.step("tools/call read_text_file", lambda: c.call_tool("read_text_file", {"path": path}))
    await run.step(
        "tools/call edit_file (dry run)",
        lambda: c.call_tool(
            "edit_file",
            {"path": path, "edits": [{"oldText": "first", "newText": "second"}], "dryRun": True},
        ),
    )
    await run.step("tools/call list_directory", lambda: c.call_tool("list_directory", {"path": root}))
    await run.step("tools/call directory_tree", lambda: c.call_tool("directory_tree", {"path": root}))
    await run.step("tools/call search_files", lambda: c.call_tool("search_files", {"path": root, "pattern": "*.txt"}))
    await run.step(
        "tools/call read_text_file outside the root (error)",
        lambda: c.call_tool("read_text_file", {"path": "/etc/hostname"}),
    )
    # A user overwrites the file, then restores the first version: the same
    # write_file call as above, sent again on purpose.
    await run.step(
        "tools/call write_file (overwrite)",
        lambda: c.call_tool("write_file", {"path": path, "content": "second draft\n"}),
    )
    await run.step("tools/call read_text_file after the overwrite", lambda: c.call_tool("read_text_file", {"path": path}))
    await run.step(
        "tools/call write_file (restore the first draft, same call as before)",
        lambda: c.call_tool("write_file", {"path": path, "content": "first draft\n"}),
    )
    await run.step("tools/call read_text_file after the restore", lambda: c.call_tool("read_text_file", {"path": path}))
    with open(path, encoding="utf-8") as f:
        run.record("file content on disk at the end", f.read())


async def memory(run: Run, c: Client) -> None:
    """server-memory on an empty graph file: create, read, delete, re-create."""
    alice = {"name": "Alice", "entityType": "person", "observations": ["writes Rust"]}
    bob = {"name": "Bob", "entityType": "person", "observations": ["reviews code"]}
    await run.step("tools/list", c.list_tools)
    await run.step("tools/call read_graph (empty)", lambda: c.call_tool("read_graph", {}))
    await run.step("tools/call create_entities Alice", lambda: c.call_tool("create_entities", {"entities": [alice]}))
    await run.step("tools/call create_entities Bob", lambda: c.call_tool("create_entities", {"entities": [bob]}))
    await run.step(
        "tools/call create_relations",
        lambda: c.call_tool(
            "create_relations", {"relations": [{"from": "Bob", "to": "Alice", "relationType": "reviews for"}]}
        ),
    )
    await run.step(
        "tools/call add_observations",
        lambda: c.call_tool(
            "add_observations", {"observations": [{"entityName": "Alice", "contents": ["likes tea"]}]}
        ),
    )
    await run.step("tools/call read_graph", lambda: c.call_tool("read_graph", {}))
    await run.step("tools/call search_nodes", lambda: c.call_tool("search_nodes", {"query": "tea"}))
    await run.step("tools/call open_nodes", lambda: c.call_tool("open_nodes", {"names": ["Bob"]}))
    # Delete Bob, then create him again with the very same call as before.
    await run.step("tools/call delete_entities", lambda: c.call_tool("delete_entities", {"entityNames": ["Bob"]}))
    await run.step("tools/call read_graph after the delete", lambda: c.call_tool("read_graph", {}))
    await run.step(
        "tools/call create_entities Bob again (same call as before)",
        lambda: c.call_tool("create_entities", {"entities": [bob]}),
    )
    await run.step("tools/call read_graph at the end", lambda: c.call_tool("read_graph", {}))
    with open(os.environ["MEMORY_FILE_PATH"], encoding="utf-8") as f:
        run.record("memory file on disk at the end", f.read())


async def python_server(run: Run, c: Client) -> None:
    """The Python SDK server (py_server.py), in whichever era was negotiated."""
    # 2026-07-28 has no ping (the server answers -32601); the initialize era has.
    modern = c.session.discover_result is not None
    await run.step("ping", c.send_ping, expect="error" if modern else "result")
    await run.step("tools/list", c.list_tools)
    await run.step("tools/call echo", lambda: c.call_tool("echo", {"message": "hello, interop"}))
    await run.step("tools/call add", lambda: c.call_tool("add", {"a": 40, "b": 2}))
    progress: list[Any] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append({"progress": p, "total": total, "message": message})

    await run.step(
        "tools/call count (progress)",
        lambda: c.call_tool("count", {"steps": 3, "delay": 0.1}, progress_callback=on_progress),
    )
    run.record("progress notifications of count", progress, ok=len(progress) == 3)
    await run.step(
        "tools/call add with invalid arguments (error)",
        lambda: c.call_tool("add", {"a": "forty"}),
        expect="any",
    )
    # Sampling: a sampling/createMessage request mid-call in the initialize
    # era, an input_required result and a second round in 2026-07-28 (the
    # SDK drives that loop with the sampling callback).
    await run.step("tools/call haiku (sampling)", lambda: c.call_tool("haiku", {"topic": "proxies"}))
    await run.step(
        "tools/call haiku again (same topic, a new sample)", lambda: c.call_tool("haiku", {"topic": "proxies"})
    )
    run.record("sampling requests the client answered", run.sampling_requests, ok=len(run.sampling_requests) == 2)
    await run.step("resources/list", c.list_resources)
    await run.step("resources/templates/list", c.list_resource_templates)
    await run.step("resources/read", lambda: c.read_resource("interop://greeting"))
    await run.step("resources/read (template)", lambda: c.read_resource("interop://numbers/7"))
    await run.step("prompts/list", c.list_prompts)
    await run.step("prompts/get", lambda: c.get_prompt("review", {"code": "fn main() {}"}))
    await run.cancel_long_call(c, "count", {"steps": 10, "delay": 0.1}, "cancellation of a long call")
    await run.step("tools/call echo after the cancellation", lambda: c.call_tool("echo", {"message": "still here"}))
    await anyio.sleep(1.2)
    await run.step("ping at the end", c.send_ping, expect="error" if modern else "result")


async def python_http(run: Run, c: Client) -> None:
    """The Python SDK server over Streamable HTTP (py_http_server.py), in
    whichever era was negotiated, with the steps that matter over HTTP."""
    # In 2026-07-28 the server wants an Mcp-Param-Region header for this call,
    # which no one can send before reading the tool's schema: the first POST
    # is refused with -32020, the tools are read, the call is sent again.
    await run.step("tools/call locate before tools/list", lambda: c.call_tool("locate", {"region": "eu-west-1"}))
    await python_server(run, c)
    # Not plain ASCII: in 2026-07-28 the header carries it base64-encoded.
    await run.step("tools/call locate (non-ASCII region)", lambda: c.call_tool("locate", {"region": "Zürich ☃"}))
    # Through mcp-retry, a fault proxy cuts this call's stream after its
    # first progress event (run.py checks what followed from the server's
    # execution log); the client must see the same as directly.
    progress: list[Any] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append({"progress": p, "total": total, "message": message})

    await run.step(
        "tools/call count (its stream cut through mcp-retry)",
        lambda: c.call_tool("count", CUT_ARGUMENTS, progress_callback=on_progress),
    )
    run.record("progress notifications of the cut count", progress, ok=len(progress) == 4)


# The arguments of the call whose stream the fault proxy cuts (run.py finds
# the call by its `delay`).
CUT_ARGUMENTS = {"steps": 4, "delay": 0.25}

SCENARIOS = {
    "everything": everything,
    "filesystem": filesystem,
    "memory": memory,
    "python-server": python_server,
    "python-http": python_http,
}


async def main() -> None:
    scenario, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    assert sys.argv[4] == "--"
    command = sys.argv[5:]
    run = Run()
    if command[0].startswith("http://"):
        server: StdioServerParameters | str = command[0]
    else:
        server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    client = Client(
        server,
        mode=mode,
        cache=None,  # no client-side response cache: every call goes to the wire
        sampling_callback=run.sampling,
        elicitation_callback=run.elicitation,
        list_roots_callback=run.list_roots if scenario == "everything" else None,
        logging_callback=run.logging,
        message_handler=run.message,
        client_info=types.Implementation(name="mcp-retry-interop", version="1.0.0"),
        read_timeout_seconds=30,
    )
    async with client as c:
        session = c.session
        run.record(
            "handshake",
            {
                "protocolVersion": c.protocol_version,
                "era": "server/discover" if session.discover_result is not None else "initialize",
                "initialize": dump(session.initialize_result),
                "discover": dump(session.discover_result),
            },
        )
        await SCENARIOS[scenario](run, c)
    # Notifications other than logging (list_changed, resource updates...).
    run.record("notifications received", run.notifications)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"steps": run.steps, "cancelled": run.cancelled}, f, indent=1)


if __name__ == "__main__":
    anyio.run(main)
