"""``PlainFrames`` answers as websockets' ``Protocol`` does: both are driven with the same bytes,
in the same pieces, and the same calls, and every answer is compared after every step (the
events, the bytes to send and where the stream ends, the state, the exceptions)."""

from __future__ import annotations

import logging
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Opcode
from websockets.protocol import Protocol, Side

from execbox_runner.daemon.net.frames import PlainFrames

MAX_SIZE = 1000
LOG = logging.getLogger("websockets.server")


def frame(first: int, payload: bytes, key: bytes | None, length_form: int = 0) -> bytes:
    """A frame as a client might send it: ``first`` the FIN/RSV/opcode byte; ``key`` its mask (None:
    unmasked); ``length_form`` 126 or 127 to state a short length in a longer form."""
    length = len(payload)
    mask_bit = 0x80 if key is not None else 0
    if length_form == 127 or length > 65535:
        head = struct.pack("!BBQ", first, mask_bit | 127, length)
    elif length_form == 126 or length > 125:
        head = struct.pack("!BBH", first, mask_bit | 126, length)
    else:
        head = bytes((first, mask_bit | length))
    if key is None:
        return head + payload
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


keys = st.binary(min_size=4, max_size=4)
texts = st.binary(max_size=200)
close_payloads = st.one_of(
    st.sampled_from([b"", b"\x03\xe8", b"\x03\xe9", b"\x03\xed", b"\x03\xe7", b"\x0b\xb8", b"\x13\x87", b"\x13\x88"]),
    st.builds(lambda code, reason: struct.pack("!H", code) + reason, st.integers(0, 65535), st.binary(max_size=130)),
    st.binary(min_size=1, max_size=3),
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            ["text", "text", "text", "close", "close", "ping", "pong", "binary", "fragment", "odd", "big", "form"]
        )
    )
    key = draw(keys)
    if kind == "text":
        return frame(0x81, draw(texts), key)
    if kind == "close":
        return frame(0x88, draw(close_payloads), draw(st.one_of(st.none(), keys)) if draw(st.booleans()) else key)
    if kind == "ping":
        return frame(0x89, draw(st.binary(max_size=130)), key)
    if kind == "pong":
        return frame(0x8A, draw(st.binary(max_size=20)), key)
    if kind == "binary":
        return frame(0x82, draw(texts), key)
    if kind == "fragment":
        return frame(0x01, draw(texts), key) + frame(0x80, draw(texts), key)
    if kind == "big":
        return frame(0x81, bytes(draw(st.sampled_from([MAX_SIZE, MAX_SIZE + 1, 70000]))), key)
    if kind == "form":
        return frame(0x81, draw(texts), key, draw(st.sampled_from([126, 127])))
    first = draw(st.sampled_from([0x83, 0x8B, 0xC1, 0xA1, 0x91, 0x00, 0x80]))  # bad opcodes, RSV bits, CONT
    return frame(first, draw(texts), draw(st.one_of(st.none(), keys)))


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """Steps: bytes in pieces (the frames' bytes cut anywhere), sends, and perhaps the end of stream."""
    stream = b"".join(draw(st.lists(frames(), max_size=6)))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    steps: list[tuple[Any, ...]] = []
    for piece in pieces:
        steps.append(("data", piece))
        if draw(st.integers(0, 4)) == 0:
            steps.append(("text", draw(texts)))
        if draw(st.integers(0, 12)) == 0:
            steps.append(
                ("close", draw(st.sampled_from([1000, 1001, 1002, 1008, 1011, 4000])), draw(st.text(max_size=10)))
            )
    if draw(st.booleans()):
        steps.append(("eof",))
    if draw(st.booleans()):
        steps.append(("text", draw(texts)))
    return steps


def step(protocol: Protocol | PlainFrames, action: tuple[Any, ...]) -> tuple[Any, ...]:
    """Take one step; everything the protocol answers to it."""
    try:
        if action[0] == "data":
            protocol.receive_data(action[1])
        elif action[0] == "eof":
            protocol.receive_eof()
        elif action[0] == "text":
            protocol.send_text(action[1])
        else:
            protocol.send_close(action[1], action[2])
        raised = None
    except Exception as exc:
        raised = (type(exc), str(exc))
    events = [(event.opcode, bytes(event.data), event.fin) for event in protocol.events_received()]
    return raised, events, protocol.data_to_send(), protocol.state, protocol.close_expected(), protocol.eof_sent


@settings(max_examples=600, deadline=None)
@given(scripts(), st.sampled_from([MAX_SIZE, 100, 2]))
def test_plain_frames_answer_as_websockets_does(script: list[tuple[Any, ...]], max_size: int) -> None:
    """With the daemon's kind of limit, and with limits below a control frame's (an operator's)."""
    plain = PlainFrames(max_size=max_size, logger=LOG)
    full = Protocol(Side.SERVER, max_size=max_size, logger=LOG)
    for index, action in enumerate(script):
        assert step(plain, action) == step(full, action), (index, action)


def test_a_plain_session_never_makes_a_protocol() -> None:
    """The common case stays on the fast path: an execute, the answers, the host's close, EOF."""
    plain = PlainFrames(max_size=MAX_SIZE, logger=LOG)
    plain.receive_data(frame(0x81, b'{"type":"execute"}', b"abcd")[:5])
    plain.receive_data(frame(0x81, b'{"type":"execute"}', b"abcd")[5:])
    assert [(e.opcode, e.data) for e in plain.events_received()] == [(Opcode.TEXT, b'{"type":"execute"}')]
    plain.send_text(b"started")
    plain.send_text(b"done")
    plain.receive_data(frame(0x88, b"\x03\xe8", b"wxyz"))
    plain.receive_eof()
    assert plain.data_to_send() == [b"\x81\x07started", b"\x81\x04done", b"\x88\x02\x03\xe8", b""]
    assert plain._full is None


def test_a_frame_too_big_for_the_limit_is_refused_on_its_header_as_websockets_does() -> None:
    """websockets refuses a frame longer than its limit as soon as the header says so (1009), and
    a control frame longer than 125 bytes once it is whole: the same steps get the same answers."""
    for max_size, data in (
        (2, frame(0x88, b"\x03\xe8bye", b"abcd")),  # a close over a small limit
        (1000, frame(0x88, b"\x03\xe8" + b"r" * 130, b"abcd")),  # a close over 125 bytes
        (100, frame(0x81, b"x" * 101, b"abcd")),  # a text frame over the limit
    ):
        plain = PlainFrames(max_size=max_size, logger=LOG)
        full = Protocol(Side.SERVER, max_size=max_size, logger=LOG)
        for piece in (data[:8], data[8:]):
            assert step(plain, ("data", piece)) == step(full, ("data", piece)), (max_size, piece)
