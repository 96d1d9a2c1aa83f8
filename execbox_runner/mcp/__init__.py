"""Code mode for MCP: MCP servers' tools as providers, and an MCP server that runs code against them.

Needs the ``mcp`` extra (``pip install -e '.[mcp]'`` in a checkout); the modules
import the SDK, this package does not, so ``execbox-runner mcp --help`` works
without it. Like the client, it never imports the daemon or the worker.

- ``provider.mcp_tools(session)``: a connected ``ClientSession``'s tools as one
  namespace of ``Providers``;
- ``codemode.CodeMode``: ``search_tools`` and ``execute_code`` over such namespaces;
- ``server.serve(...)``: the code-mode MCP server (stdio or streamable HTTP),
  as ``execbox-runner mcp --config servers.json`` runs it.
"""
