"""The soak: a seeded random mix of host sessions against one daemon for minutes, checking invariants.

Client threads run sessions back to back, drawn from a seeded mix (``mix.py``): ok executions
with logs, 1-10 tool calls, failing tool results, guests that throw, memory bombs, spinning
guests with short ``timeoutMs``, cancels of parked and of spinning guests, several executions on
one connection, hosts that vanish mid-execution (TCP RST, or a close without a close frame),
hostile frames, slow tools. Beside them, sentinels (``run.py``) keep innocent executions parked
on a tool long enough to outlive any worker the daemon gives up on; they must end ``ok``.

Checked per session: exactly one ``done`` per accepted execution, with the expected ``ok`` or
error code and every line the guest logged; each hostile frame gets its documented answer (a
``done`` with a stable code, or a close frame with its code, never a bare TCP close); every
closing handshake is answered. Checked every second (``watch.py``): the daemon is alive and
``/healthz`` answers; after the load, no session is left open. A violation fails the test;
timings are printed, never asserted. ``tests/test_soak.py`` runs it under ``pytest -m stress``.
"""
