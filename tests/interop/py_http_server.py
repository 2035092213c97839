"""The interop suite's Python SDK server (py_server.py) over Streamable HTTP.

    py_http_server.py PORT EXEC_LOG [--event-store]

Serves py_server.py's tools, resources and prompts on
http://127.0.0.1:PORT/mcp in both eras (the SDK's dual-era transport: the
`initialize` sessions of 2025-11-25 and the sessionless 2026-07-28), plus two
tools for the fault scenarios (py_faults.py):

* `append(note)`, not annotated: a side effect, which a client must never
  cause twice (nothing is appended anywhere but the execution log);
* `announce(topic)`: sends `notifications/resources/updated` for
  `interop://announced/TOPIC` outside any request, so that over HTTP it
  travels on the session's GET stream;

and two tools that only matter over HTTP in 2026-07-28:

* `locate(region)`, whose `region` argument is marked `x-mcp-header: Region`:
  a client must mirror it into an `Mcp-Param-Region` header (the server
  answers 400 -32020 HeaderMismatch otherwise);
* `misdeclared(x)`, whose `x-mcp-header` sits on a number: an invalid
  annotation, so an HTTP client must leave the tool out of `tools/list`.

With `--event-store`, every SSE event gets an id and is kept in memory, so a
2025-era client can resume a cut stream with `Last-Event-ID`. Every tool run
is appended to EXEC_LOG as a JSON line (`{"tool": ..., "arguments": ...}`):
the suite counts executions from it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Annotated, Any

from mcp_types import ToolAnnotations
from pydantic import Field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mcp.server.mcpserver import Context  # noqa: E402
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore  # noqa: E402
from py_server import server  # noqa: E402


@server.tool()
def append(note: str) -> str:
    """Appends a note (a side effect: not read-only, not idempotent)."""
    return f"appended {note}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def announce(topic: str, ctx: Context) -> str:
    """Announces `topic` on the session's own stream (not this request's)."""
    await ctx.session.send_resource_updated(f"interop://announced/{topic}")
    return f"announced {topic}"


@server.tool()
def locate(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
    """Says where a request was routed (its region travels in a header too)."""
    return f"routed to {region}"


@server.tool()
def misdeclared(x: float) -> str:
    """Its x-mcp-header annotation is invalid (on a number): HTTP clients leave it out."""
    return f"x = {x}"


class MemoryEventStore(EventStore):
    """Every event of every stream, in order, with ids 1, 2, ..."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []  # (event id, stream id, message)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        stream = next((s for e, s, _ in self.events if e == last_event_id), None)
        if stream is None:
            return None
        after = False
        for event_id, stream_id, message in self.events:
            if after and stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream


def log_executions(path: str) -> None:
    """Wraps every tool so that each run is appended to `path`."""

    def record(name: str, kwargs: dict[str, Any]) -> None:
        plain = {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool)) or v is None}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": name, "arguments": plain}) + "\n")

    for tool in server._tool_manager.list_tools():  # the SDK has no public hook for this
        fn = tool.fn
        if tool.is_async:

            async def run_async(*args: Any, _fn: Any = fn, _name: str = tool.name, **kwargs: Any) -> Any:
                record(_name, kwargs)
                return await _fn(*args, **kwargs)

            tool.fn = run_async
        else:

            def run_sync(*args: Any, _fn: Any = fn, _name: str = tool.name, **kwargs: Any) -> Any:
                record(_name, kwargs)
                return _fn(*args, **kwargs)

            tool.fn = run_sync


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("exec_log")
    ap.add_argument("--event-store", action="store_true")
    args = ap.parse_args()
    log_executions(args.exec_log)
    # The SDK refuses to register a tool with an invalid annotation: this
    # one gets it afterwards, as a server with a hand-written schema would.
    schema = server._tool_manager.get_tool("misdeclared").parameters
    schema["properties"]["x"]["x-mcp-header"] = "X"
    server.run(
        "streamable-http",
        host="127.0.0.1",
        port=args.port,
        event_store=MemoryEventStore() if args.event_store else None,
        retry_interval=100,
    )


if __name__ == "__main__":
    main()
