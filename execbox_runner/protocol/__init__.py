"""The rules of the execbox runner protocol, with no I/O.

``messages`` (the wire types), ``session`` (the specification's rules as a
Sans-I/O state machine), ``ipc`` (the daemon <-> worker messages) and
``schema`` (the JSON Schema generated from the wire types). Nothing here
imports trio, sockets, processes or threads: a test keeps it so.
"""
