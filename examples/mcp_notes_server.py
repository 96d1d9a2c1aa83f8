"""A tiny MCP server to try code mode with (docs: Code mode for MCP): notes kept in memory.

Wrap it with ``execbox-runner mcp --config servers.json``, where servers.json names the Python
that has the ``mcp`` extra, with absolute paths (MCP clients start servers from a directory of
their own): ``{"mcpServers": {"notes": {"command": "/abs/.venv/bin/python", "args":
["/abs/examples/mcp_notes_server.py"]}}}``.
"""

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes")
notes: dict[str, str] = {}


@server.tool(name="add-note")
def add_note(title: str, text: str) -> str:
    """Store a note under a title."""
    notes[title] = text
    return title


@server.tool(name="list-notes")
def list_notes() -> list[str]:
    """The titles of all notes."""
    return sorted(notes)


@server.tool(name="read-note")
def read_note(title: str) -> str:
    """The text of one note."""
    if title not in notes:
        raise ToolError(f"no note titled {title!r}")
    return notes[title]


if __name__ == "__main__":
    server.run()
