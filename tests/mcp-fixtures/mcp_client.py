"""A standard MCP client (the `mcp` Python package, installed by
.ci/mcp-servers.sh) against Belay's MCP endpoint, for tests/tests/mcp.rs.

Usage: mcp_client.py URL TOKEN TOOL ARGUMENTS_JSON IDEMPOTENCY_KEY

Connects over Streamable HTTP with `Authorization: Bearer TOKEN`, lists the
tools, calls TOOL with ARGUMENTS_JSON twice with the same idempotency key
(`_meta["io.belay/idempotency-key"]`) and once more without one, and prints
one JSON document: the tools (name, input schema) and the three results as
they came over the wire.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def wire(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def main() -> None:
    url, token, tool, arguments, key = sys.argv[1:6]
    arguments = json.loads(arguments)
    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                listed = await session.list_tools()
                meta = {"io.belay/idempotency-key": key}
                first = await session.call_tool(tool, arguments, meta=meta)
                again = await session.call_tool(tool, arguments, meta=meta)
                other = await session.call_tool(tool, arguments)
    print(
        json.dumps(
            {
                "server": init.server_info.name,
                "protocol_version": init.protocol_version,
                "tools": [
                    {"name": t.name, "input_schema": t.input_schema} for t in listed.tools
                ],
                "first": wire(first),
                "again": wire(again),
                "other": wire(other),
            }
        )
    )


asyncio.run(main())
