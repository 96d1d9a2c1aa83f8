"""execbox-runner: a daemon that runs untrusted guest JavaScript for execbox hosts.

Three layers, one subpackage each: ``protocol`` (pure rules and message types),
``daemon`` (the WebSocket side: sockets, trio, the worker pool) and ``worker``
(the confined processes where guest code runs). ``daemon`` and ``worker`` both
depend on ``protocol``; the worker never imports the daemon.
"""

__version__ = "0.2.0.dev0"
