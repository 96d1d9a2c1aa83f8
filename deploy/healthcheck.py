"""The image's HEALTHCHECK: GET /healthz of the daemon on this host; exit 0 on 200, else 1.

The sessions' port, not the metrics port: its /healthz answers without a token (bare, when
/metrics lives on a metrics port or behind a metrics token), and fails when that port does.

HTTPS when EXECBOX_RUNNER_CERTFILE is set (the certificate is not verified: the name is the
loopback address and the check is on the same host), else HTTP; and the other when the port speaks
it instead, so that TLS set by a flag after the image's name or by a --config file is checked too.
The port is EXECBOX_RUNNER_HEALTHCHECK_PORT, else EXECBOX_RUNNER_PORT, else 8765. Standard library
only.
"""

from __future__ import annotations

import http.client
import os
import ssl
import sys


def status(port: int, tls: bool) -> int:
    """The HTTP status of GET /healthz on 127.0.0.1:``port``, over HTTPS with ``tls``."""
    connection: http.client.HTTPConnection
    if tls:
        context = ssl._create_unverified_context()  # noqa: S323 -- loopback, same host, self-check
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
    else:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    finally:
        connection.close()


def main() -> int:
    for variable in ("EXECBOX_RUNNER_HEALTHCHECK_PORT", "EXECBOX_RUNNER_PORT"):
        if given := os.environ.get(variable):
            break
    else:
        variable, given = "", "8765"
    if not given.isdigit() or not 0 < int(given) < 65536:
        print(f"healthcheck: invalid {variable} {given!r}: must be a port number 1-65535", file=sys.stderr)
        return 1
    port = int(given)
    tls = bool(os.environ.get("EXECBOX_RUNNER_CERTFILE"))
    mismatches = []
    for scheme in (tls, not tls):
        try:
            return 0 if status(port, scheme) == 200 else 1
        except (ssl.SSLError, http.client.RemoteDisconnected) as exc:  # the port speaks the other
            mismatches.append(f"{'https' if scheme else 'http'}: {exc}")
        except (OSError, http.client.HTTPException) as exc:
            print(f"healthcheck: {exc}", file=sys.stderr)
            return 1
    print(f"healthcheck: {'; '.join(mismatches)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
