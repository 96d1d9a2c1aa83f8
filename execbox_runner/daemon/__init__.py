"""The daemon: WebSocket connections, HTTP endpoints, the worker pool and the command line.

It drives ``protocol.session`` with bytes from sockets and messages from
workers, and never runs guest code itself.
"""
