"""A small stdio MCP server built on the pinned official Python SDK.

The reference servers (server-everything, -filesystem, -memory) are built on
the TypeScript SDK 1.x, which only speaks the `initialize` era: they answer a
`server/discover` probe with "Method not found". This server runs the Python
SDK's dual-era loop, so a client in `mode="auto"` adopts the 2026-07-28 era
through `server/discover`, and one in `mode="legacy"` gets the `initialize`
handshake: it lets the suite cover both eras through the proxy with a real
SDK on each side. Everything here is deterministic.
"""
from typing import Annotated

import anyio
from mcp.server.mcpserver import Context, MCPServer, Resolve, Sample
from mcp_types import CreateMessageResult, SamplingMessage, TextContent, ToolAnnotations

server = MCPServer("interop-python-server", instructions="Deterministic tools for mcp-retry's interop suite.")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(message: str) -> str:
    """Echoes back the input string."""
    return f"Echo: {message}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
async def count(steps: int, delay: float, ctx: Context) -> str:
    """Counts to `steps`, reporting progress after each `delay` seconds."""
    for i in range(1, steps + 1):
        await anyio.sleep(delay)
        await ctx.report_progress(i, steps, f"step {i}")
    return f"counted to {steps}"


def ask_for_haiku(topic: str) -> Sample:
    return Sample(
        [SamplingMessage(role="user", content=TextContent(type="text", text=f"A haiku about {topic}, please."))],
        max_tokens=60,
    )


# It only asks the client's model and changes nothing: read-only, so an
# identical later call runs again (and samples again) instead of being replayed.
@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def haiku(topic: str, reply: Annotated[CreateMessageResult, Resolve(ask_for_haiku)]) -> str:
    """Asks the client's model for a haiku: a sampling/createMessage request
    mid-call in the initialize era, an input_required round trip in 2026-07-28."""
    return f"{topic}: {reply.content.text}"


@server.resource("interop://greeting", mime_type="text/plain")
def greeting() -> str:
    """A static greeting."""
    return "Hello from the interop server"


@server.resource("interop://numbers/{n}")
def number(n: str) -> str:
    """A templated resource."""
    return f"number {n}"


@server.prompt()
def review(code: str) -> str:
    """Asks for a review of `code`."""
    return f"Please review this code:\n{code}"


if __name__ == "__main__":
    server.run("stdio")
