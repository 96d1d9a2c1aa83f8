"""The image's HEALTHCHECK: GET /healthz of the daemon on this host; exit 0 on 200, else 1.

The sessions' port, not the metrics port: its /healthz answers without a token (bare, when
/metrics lives on a metrics port or behind a metrics token), and fails when that port does.

HTTPS when EXECBOX_RUNNER_CERTFILE is set (the certificate is not verified: the name is the
loopback address and the check is on the same host), else HTTP. The port is
EXECBOX_RUNNER_HEALTHCHECK_PORT, else EXECBOX_RUNNER_PORT, else 8765. Standard library only.
"""

from __future__ import annotations

import http.client
import os
import ssl
import sys


def main() -> int:
    port = int(os.environ.get("EXECBOX_RUNNER_HEALTHCHECK_PORT") or os.environ.get("EXECBOX_RUNNER_PORT") or 8765)
    connection: http.client.HTTPConnection
    if os.environ.get("EXECBOX_RUNNER_CERTFILE"):
        context = ssl._create_unverified_context()  # noqa: S323 -- loopback, same host, self-check
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
    else:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/healthz")
        status = connection.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    finally:
        connection.close()
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
