"""The baseline for `bench_serve.py`: a trivial stdio MCP server (official
Python SDK) with one tool that upper-cases a text, doing nothing else."""

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("trivial")


@mcp.tool(description="Upper-case a text.")
def upper(text: str) -> str:
    return text.upper()


if __name__ == "__main__":
    mcp.run("stdio")
