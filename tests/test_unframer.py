"""The channel's frames come out whole whatever pieces the bytes arrive in, and a reader's bound
on what a header announces holds before any of the body is kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execbox_runner.protocol import ipc


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(min_value=1, max_value=64), min_size=1))
def test_frames_split_anywhere_come_out_whole_and_in_order(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(ipc.HEADER.pack(len(body)) + body for body in bodies)
    frames = ipc.Unframer()
    out: list[bytes] = []
    position = 0
    for index in range(len(stream) + 1):
        while (body := frames.next()) is not None:
            out.append(body)
        if position >= len(stream):
            break
        assert frames.missing() >= 1
        size = cuts[index % len(cuts)]
        frames.feed(stream[position : position + size])
        position += size
    assert out == bodies
    assert frames.missing() == ipc.HEADER.size


def test_a_header_over_the_bound_is_refused_before_its_body_arrives() -> None:
    frames = ipc.Unframer(max_body=10)
    frames.feed(ipc.HEADER.pack(10) + b"0123456789" + ipc.HEADER.pack(11))
    assert frames.next() == b"0123456789"
    with pytest.raises(ipc.FrameTooLarge) as raised:
        frames.next()
    assert raised.value.length == 11


def test_missing_counts_what_the_next_frame_still_needs() -> None:
    frames = ipc.Unframer()
    frames.feed(ipc.HEADER.pack(5)[:2])
    assert frames.missing() == ipc.HEADER.size - 2
    frames.feed(ipc.HEADER.pack(5)[2:] + b"ab")
    assert (frames.missing(), frames.next()) == (3, None)
    frames.feed(b"cde")
    assert (frames.missing(), frames.next()) == (0, b"abcde")
