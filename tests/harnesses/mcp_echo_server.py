"""The tiny MCP server of the MCP tests (the real ``mcp`` package, stdio): one tool, ``polar_echo``, that appends its
text to the file ``$POLAR_MCP_LOG`` and answers ``polar-mcp-echo: <text>``."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("polar")


@server.tool()
def polar_echo(text: str) -> str:
    """Echo the text back (and log it for the test)."""
    with open(os.environ["POLAR_MCP_LOG"], "a", encoding="utf-8") as log:
        log.write(text + "\n")
    return f"polar-mcp-echo: {text}"


if __name__ == "__main__":
    server.run()
