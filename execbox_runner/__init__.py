"""execbox-runner: a daemon that runs untrusted guest JavaScript for execbox hosts.

Five subpackages, one per part: ``protocol`` (pure rules and message types),
``daemon`` (the WebSocket side: sockets, trio, the worker pool), ``worker`` (the
confined processes where guest code runs), ``client`` (hosts in Python) and
``mcp`` (code mode for MCP clients, on the client). ``daemon`` and ``worker``
both depend on ``protocol``; the worker never imports the daemon; ``client`` and
``mcp`` reach a daemon over the wire only, importing neither, and the daemon imports
neither of them (``tests/test_layers.py``). ``cli`` is the ``execbox-runner`` command, made of
each part's commands.
"""

__version__ = "0.2.0.dev0"
