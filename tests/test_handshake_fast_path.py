"""The opening handshake's fast path (``daemon/net/handshake.py``): whenever it takes a request,
websockets' own server would have parsed the same request and accepted it with the same
``Sec-WebSocket-Accept``; everything else is left to websockets. And over real sockets, a
session opens on either path."""

from __future__ import annotations

import base64
import email.utils
import json
import socket
import struct
import time

from hypothesis import event, given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.http11 import MAX_LINE_LENGTH, Request
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from execbox_runner.daemon.net import handshake

from .daemonkit import execute, running_daemon
from .test_http_edge import SOCKET_TIMEOUT_S, UPGRADE, address, masked_text

PLAIN = (UPGRADE + "\r\n").encode()
KEY = "dGhlIHNhbXBsZSBub25jZQ=="
ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455's example answer to KEY


def websockets_view(data: bytes) -> tuple[Request | None, int | None, str | None]:
    """What websockets' server makes of ``data``: the request, its answer's status, its accept key."""
    protocol = ServerProtocol()
    protocol.receive_data(data)
    requests = [parsed for parsed in protocol.events_received() if isinstance(parsed, Request)]
    if not requests:
        return None, None, None
    response = protocol.accept(requests[0])
    return requests[0], response.status_code, response.headers.get("Sec-WebSocket-Accept")


def test_a_plain_upgrade_takes_the_fast_path() -> None:
    upgrade = handshake.parse_upgrade(PLAIN + b"\x81\x80frames")
    assert upgrade is not None
    assert (upgrade.request.path, upgrade.accept, upgrade.rest) == ("/", ACCEPT, b"\x81\x80frames")
    assert upgrade.request.headers["sec-websocket-key"] == KEY


def test_common_host_variants_take_it_too() -> None:
    variants = [
        PLAIN.replace(b"Connection: Upgrade", b"Connection: keep-alive, Upgrade"),
        PLAIN.replace(b"Upgrade: websocket", b"upgrade: WebSocket").replace(b"Connection:", b"connection:"),
        PLAIN.replace(b"GET / ", b"GET /?tenant=a "),
        PLAIN[:-2] + b"Authorization: Bearer t\r\nOrigin: https://a.example\r\n\r\n",
    ]
    for data in variants:
        assert handshake.parse_upgrade(data) is not None, data


def test_the_request_of_websockets_own_client_takes_it() -> None:
    # Offering permessage-deflate, as its connect() does by default (and the TypeScript ws
    # package): no extension is accepted on either path, so the 101 names none.
    client = ClientProtocol(parse_uri("ws://127.0.0.1:8765/"), extensions=[ClientPerMessageDeflateFactory()])
    data = client.connect().serialize()
    upgrade = handshake.parse_upgrade(data)
    assert upgrade is not None and upgrade.rest == b""
    assert websockets_view(data)[1:] == (101, upgrade.accept)


def test_what_is_not_plainly_an_upgrade_is_left_to_websockets() -> None:
    others = [
        PLAIN[:-2],  # still arriving
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"),
        PLAIN.replace(b"GET", b"POST"),
        PLAIN.replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8"),
        PLAIN.replace(KEY.encode(), base64.b64encode(b"fifteen bytes!!")),
        PLAIN[:-2] + b"Sec-WebSocket-Key: " + KEY.encode() + b"\r\n\r\n",  # two keys
        PLAIN[:-2] + b"Content-Length: 5\r\n\r\nhello",
        PLAIN[:-2] + b" folded: line\r\n\r\n",
        PLAIN.replace(b"\r\nHost", b"\nHost"),
    ]
    for data in others:
        assert handshake.parse_upgrade(data) is None, data


BASE = [
    "Host: 127.0.0.1",
    "Upgrade: websocket",
    "Connection: Upgrade",
    f"Sec-WebSocket-Key: {KEY}",
    "Sec-WebSocket-Version: 13",
]


def test_the_longest_line_is_websockets_longest() -> None:
    for size, taken in ((MAX_LINE_LENGTH - 2, True), (MAX_LINE_LENGTH - 1, False)):
        data = PLAIN[:-2] + b"X-Long: " + b"a" * (size - len(b"X-Long: ")) + b"\r\n\r\n"
        assert (handshake.parse_upgrade(data) is not None) is taken
        assert (websockets_view(data)[1] == 101) is taken


LINES = st.sampled_from(
    [
        "Host: 127.0.0.1",
        "Upgrade: websocket",
        "Upgrade: WebSocket",
        "Upgrade: h2c",
        "Upgrade: websocket, h2c",
        "Connection: Upgrade",
        "Connection: keep-alive, upgrade",
        "Connection: close",
        "Connection: Upgrade;x",
        f"Sec-WebSocket-Key: {KEY}",
        "Sec-WebSocket-Key: not base64!",
        "Sec-WebSocket-Key: AAAA",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Version: 13, 8",
        "Sec-WebSocket-Extensions: permessage-deflate",
        "Sec-WebSocket-Protocol: chat",
        "Content-Length: 0",
        "Transfer-Encoding: chunked",
        "X-Value: caf\xe9",
        "Bad Name: x",
        "X-Tab:\tvalue\t",
        "NoColon",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    start=st.sampled_from(
        ["GET / HTTP/1.1", "GET /a?b=c HTTP/1.1", "GET  / HTTP/1.1", "PUT / HTTP/1.1", "GET / HTTP/1.0"]
    ),
    lines=st.lists(LINES, max_size=4).flatmap(lambda extra: st.permutations([*BASE, *extra])),
    rest=st.sampled_from([b"", b"\x88\x80abcd", b"junk"]),
)
def test_whenever_the_fast_path_answers_websockets_agrees(start: str, lines: list[str], rest: bytes) -> None:
    data = "\r\n".join([start, *lines, "", ""]).encode("iso-8859-1") + rest
    fast = handshake.parse_upgrade(data)
    event("fast path" if fast is not None else "left to websockets")
    if fast is None:
        return
    request, status, accept = websockets_view(data)
    assert request is not None and status == 101
    assert (fast.request.path, list(fast.request.headers.raw_items())) == (
        request.path,
        list(request.headers.raw_items()),
    )
    assert fast.accept == accept and fast.rest == rest


def test_the_answer_is_websockets_own_plus_the_request_id() -> None:
    protocol = ServerProtocol()
    protocol.receive_data(PLAIN)
    (request,) = protocol.events_received()
    assert isinstance(request, Request)
    response = protocol.accept(request)
    response.headers["X-Request-Id"] = "abc"
    before = time.time()
    ours = handshake.response(ACCEPT, "abc").split(b"\r\n")
    after = time.time()
    theirs = response.serialize().split(b"\r\n")
    assert [line for line in ours if not line.startswith(b"Date: ")] == [
        line for line in theirs if not line.startswith(b"Date: ")
    ]
    (date,) = [line for line in ours if line.startswith(b"Date: ")]
    sent = email.utils.parsedate_to_datetime(date[len(b"Date: ") :].decode())
    assert date.endswith(b" GMT") and int(before) <= sent.timestamp() <= after  # the second it was made


def open_session(sock: socket.socket, writes: list[bytes]) -> bytes:
    """Send the handshake in ``writes`` (one segment each), then an execute; the 101's head."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for data in writes:
        sock.sendall(data)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return head


def read_text(sock: socket.socket) -> dict[str, object]:
    """One unmasked server text frame."""
    first, second = sock.recv(1), sock.recv(1)
    assert first == b"\x81"
    size = second[0]
    if size == 126:
        size = struct.unpack("!H", sock.recv(2))[0]
    payload = b""
    while len(payload) < size:
        payload += sock.recv(size - len(payload))
    message: dict[str, object] = json.loads(payload)
    return message


def test_a_session_opens_on_either_path_over_a_real_socket() -> None:
    with running_daemon() as daemon:
        for name, writes in {
            "whole (fast path)": [PLAIN + masked_text(execute("fast", "1 + 1").encode())],
            "split (websockets)": [PLAIN[:20], PLAIN[20:]],
        }.items():
            with socket.create_connection(address(daemon), timeout=SOCKET_TIMEOUT_S) as sock:
                head = open_session(sock, writes)
                assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n"), name
                assert f"Sec-WebSocket-Accept: {ACCEPT}\r\n".encode() in head, name
                assert b"X-Request-Id: " in head, name
                if len(writes) > 1:
                    sock.sendall(masked_text(execute("fast", "1 + 1").encode()))
                assert read_text(sock)["type"] == "started", name
                done = read_text(sock)
                assert (done["type"], done["ok"], done["result"]) == ("done", True, 2), name


def test_a_ping_sent_with_the_request_is_answered_right_after_the_101() -> None:
    mask, payload = b"\x01\x02\x03\x04", b"hi"
    ping = b"\x89" + bytes([0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    with running_daemon() as daemon, socket.create_connection(address(daemon), timeout=SOCKET_TIMEOUT_S) as sock:
        head = open_session(sock, [PLAIN + ping])
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert sock.recv(4) == b"\x8a\x02hi"  # the pong, before the host sends anything else
