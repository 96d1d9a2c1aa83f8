r"""A service that runs its users' JavaScript on a shared remote runner, against the service's own tools.

The runner (``execbox-runner serve`` elsewhere, with tokens) never sees the
service's data or credentials: it gets code and tool names, and each tool call
comes back here over the execution's WebSocket. This is a plain threaded HTTP
server, so each request uses the synchronous API (``execute_sync``); an async
service would ``await runner.execute(...)`` instead.

    EXECBOX_RUNNER_URL=ws://runner:8765/ EXECBOX_RUNNER_TOKEN=... python examples/remote_service.py --port 8080
    curl -s localhost:8080/types
    curl -s localhost:8080/run -d '{"code": "await orders.status({order_id: \"A-1\"})"}'
"""

from __future__ import annotations

import argparse
import json
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypedDict

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
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            code = request["code"]
        except (ValueError, KeyError, TypeError):
            self._reply(HTTPStatus.BAD_REQUEST, {"error": 'send {"code": "..."}'})
            return
        try:
            result = self.runner.execute_sync(code, PROVIDERS, timeout_ms=request.get("timeoutMs", 5_000))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help=f"the runner (default: ${URL_ENV})")
    parser.add_argument("--token", help=f"its token (default: ${TOKEN_ENV})")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args()
    url = args.url or from_environment(URL_ENV, parser.prog)
    if not url:
        parser.error(f"give the runner's URL: --url or {URL_ENV}")
    Handler.runner = Runner.connect(url, token=args.token or from_environment(TOKEN_ENV, parser.prog))
    with ThreadingHTTPServer(("127.0.0.1", args.port), Handler) as server:
        print(f"remote_service listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
