r"""A service that runs its users' JavaScript on a shared remote runner, against the service's own tools.

The runner (``execbox-runner serve`` elsewhere, with tokens) never sees the
service's data or credentials: it gets code and tool names, and each tool call
comes back here over the execution's WebSocket. This is a plain threaded HTTP
server, so each request uses the synchronous API (``execute_sync``); an async
service would ``await runner.execute(...)`` instead.

    EXECBOX_RUNNER_URL=ws://runner:8765/ EXECBOX_RUNNER_TOKEN=... python examples/remote_service.py --port 8080
    curl -s localhost:8080/types
    curl -s localhost:8080/run -d '{"code": "await orders.status({order_id: \"A-1\"})"}'

``POST /run`` takes ``{"code": "...", "timeoutMs": 5000}`` (``timeoutMs`` optional) and answers 200
with the result, 400 with ``{"error": "..."}`` for a request of any other shape, and 502 when the
runner could not run the code. A URL or token the client refuses, or a port that cannot be bound,
stops the service at start with one line (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NoReturn, TypedDict

from execbox_runner.client import Providers, Runner, RunnerError, ToolError
from execbox_runner.client.environment import TOKEN_ENV, URL_ENV, from_environment


class Order(TypedDict):
    order_id: str
    status: str
    total: float


ORDERS = {
    "A-1": Order(order_id="A-1", status="shipped", total=25.0),
    "A-2": Order(order_id="A-2", status="open", total=90.0),
}


def status(order_id: str) -> Order:
    """One order, by id."""
    if order_id not in ORDERS:
        raise ToolError("validation_error", f"no order {order_id}")
    return ORDERS[order_id]


def open_orders() -> list[str]:
    """Ids of the orders that have not shipped."""
    return [order["order_id"] for order in ORDERS.values() if order["status"] == "open"]


PROVIDERS = Providers({"orders": {"status": status, "open_orders": open_orders}})


class Handler(BaseHTTPRequestHandler):
    runner: Runner  # set in main()

    def do_GET(self) -> None:
        if self.path != "/types":
            self._reply(HTTPStatus.NOT_FOUND, {"error": "GET /types or POST /run"})
            return
        body = PROVIDERS.types.encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        if self.path != "/run":
            self._reply(HTTPStatus.NOT_FOUND, {"error": "GET /types or POST /run"})
            return
        try:
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length)) if length >= 0 else None
            code, timeout_ms = request["code"], request.get("timeoutMs", 5_000)
        except (ValueError, KeyError, TypeError, AttributeError):
            code = timeout_ms = None
        if not isinstance(code, str):
            self._reply(
                HTTPStatus.BAD_REQUEST, {"error": 'send {"code": "...", "timeoutMs": 5000} (timeoutMs optional)'}
            )
            return
        try:
            result = self.runner.execute_sync(code, PROVIDERS, timeout_ms=timeout_ms)
        except ValueError as exc:  # a timeoutMs the client refuses before anything runs
            self._reply(
                HTTPStatus.BAD_REQUEST, {"error": f"timeoutMs must be a number of milliseconds above 0 ({exc})"}
            )
            return
        except RunnerError as exc:  # the runner is down, busy or refused us: not the user's fault
            self._reply(HTTPStatus.BAD_GATEWAY, {"error": str(exc)})
            return
        error = None if result.error is None else {"code": result.error.code, "message": result.error.message}
        reply = {"ok": result.ok, "result": result.result, "error": error, "logs": result.logs}
        self._reply(HTTPStatus.OK, reply)

    def _reply(self, status: HTTPStatus, value: Any) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep the example's output to its one line


def port(text: str) -> int:
    """A TCP port number for ``--port``."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"not a port number from 0 to 65535: {text!r}")
    return int(text)


def refuse(message: str) -> NoReturn:
    """Stop at start with one line on stderr and exit status 2, as argparse does for a bad flag."""
    print(message, file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help=f"the runner (default: ${URL_ENV})")
    parser.add_argument("--token", help=f"its token (default: ${TOKEN_ENV})")
    parser.add_argument("--port", type=port, default=8080, help="HTTP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args()
    url = args.url or from_environment(URL_ENV, parser.prog)
    if not url:
        parser.error(f"give the runner's URL: --url or {URL_ENV}")
    try:
        Handler.runner = Runner.connect(url, token=args.token or from_environment(TOKEN_ENV, parser.prog))
        server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    except ValueError as exc:  # a URL that is not ws:// or wss://, a token that cannot be sent
        refuse(f"{parser.prog}: error: {exc}")
    except OSError as exc:  # the port is taken, or not ours to bind
        refuse(f"{parser.prog}: error: cannot listen on 127.0.0.1:{args.port}: {exc.strerror or exc}")
    with server:
        print(f"remote_service listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
