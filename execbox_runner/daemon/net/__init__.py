"""The socket path: one reactor serving every socket (``reactor``), connections accepted in bursts
(``listeners``), reads and writes (``transport``), the opening handshake's fast path
(``handshake``) and a plain session's frames (``frames``). Nothing here knows the protocol's rules
or the workers."""
