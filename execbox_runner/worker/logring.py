"""Log lines on their way out of a running guest: a ring per execution, in memory the engine and
the worker both reach.

A guest's ``console.log`` runs inside the engine, where no Python can be called while a time
limit is set, and a guest that then spins never returns to the worker. So the bootstrap writes each
line into this ring as it is logged, an ArrayBuffer over memory the worker owns, and the worker
reads the ring from another thread while the guest runs (``logpump.LogPump``), and again as each step
ends. Whoever ends an execution, the worker or the daemon, at a deadline, on a cancel, for memory
or because the worker died, then has every line written until a few milliseconds before.

A ring slot is ``SLOT_BYTES`` of a private anonymous mapping: a header of two 32-bit counters of
UTF-16 code units, ``written`` (the engine's, advanced once the units are in) and ``read`` (the
worker's, advanced once it has copied them), then ``CAPACITY`` units of data, indexed by a counter
modulo ``CAPACITY`` (a power of two, so the counters may wrap). A line is a record: its length in
two units (low, then high), then its units, well formed. A guest that fills the ring waits in
``console.log`` until the worker has read some (or its deadline stops it); a line longer than the
ring goes through it in pieces. Both sides read and write plain memory (the bootstrap uses no
``Atomics``, which would cost every runtime the names of all its methods): the engine interprets one
store at a time, in order, and on x86-64 the engine's stores and the worker's loads are seen in the
order written (total store order).

Pages are resident only once written: a guest that logs a line costs one page, one that never logs
none, even once its slot went back to the pool as its execution ended (the counters are reset only
where they moved, and the pages past the first given back to the kernel if they were written); the
pool grows a mapping of ``REGION_SLOTS`` slots at a time, within the slack of the worker's
address-space backstop (``loop.address_space``).
"""

from __future__ import annotations

import codecs
import ctypes
import mmap
import struct
import threading
from typing import Final

SLOT_BYTES: Final = 20 << 10  # 16 bytes of header and 16 KiB of data, rounded up to whole pages
HEADER_BYTES: Final = 16
CAPACITY: Final = 1 << 13  # code units of data: the log pump empties it every few milliseconds
REGION_SLOTS: Final = 64
_PAGE: Final = mmap.PAGESIZE
_COUNTERS: Final = struct.Struct("<II")  # written, read
_READ: Final = struct.Struct("<I")
_LENGTH: Final = struct.Struct("<HH")
_MASK: Final = 0xFFFFFFFF
codecs.lookup("utf-16-le")  # imported now: a confined worker can open no file later

# Guards every ring's reading and the pool. The log pump holds it while it sends what it read, so
# that nothing it read reaches the daemon after the execution's last message.
lock: Final = threading.Lock()


class _Region:
    """One mapping of ``REGION_SLOTS`` slots, and its address."""

    def __init__(self) -> None:
        self.memory = mmap.mmap(-1, REGION_SLOTS * SLOT_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.memory)
        self._exported = ctypes.c_char.from_buffer(self.memory)  # keeps the mapping in place
        self.address = ctypes.addressof(self._exported)


_regions: Final[list[_Region]] = []
_free: Final[list[tuple[_Region, int]]] = []  # slots not in use, (region, offset); the last taken first


def _take() -> tuple[_Region, int]:
    with lock:
        if not _free:
            region = _Region()
            _regions.append(region)
            _free.extend((region, index * SLOT_BYTES) for index in reversed(range(REGION_SLOTS)))
        return _free.pop()


class LogRing:
    """One execution's ring, from the worker's side. Read under ``lock``."""

    __slots__ = ("_offset", "_partial", "_region", "closed")

    def __init__(self) -> None:
        self._region, self._offset = _take()
        self._partial = b""  # a record not yet whole: a line longer than what the ring held
        self.closed = False

    @property
    def address(self) -> int:
        """Where the slot is, for the engine's ArrayBuffer (``SLOT_BYTES`` long)."""
        return self._region.address + self._offset

    def read(self) -> list[str]:
        """(Holding ``lock``.) The lines written since the last read; their room is the engine's again."""
        if self.closed:
            return []
        view, offset = self._region.view, self._offset
        written, read = _COUNTERS.unpack_from(view, offset)
        count = (written - read) & _MASK
        if not count:
            return []
        data = offset + HEADER_BYTES
        start = read % CAPACITY
        end = start + count
        if end <= CAPACITY:
            units = view[data + 2 * start : data + 2 * end].tobytes()
        else:
            units = (
                view[data + 2 * start : data + 2 * CAPACITY].tobytes()
                + view[data : data + 2 * (end - CAPACITY)].tobytes()
            )
        _READ.pack_into(view, offset + 4, written)
        pending = self._partial + units if self._partial else units
        lines = []
        at = 0
        while len(pending) - at >= _LENGTH.size:
            low, high = _LENGTH.unpack_from(pending, at)
            end = at + _LENGTH.size + 2 * (low | high << 16)
            if end > len(pending):
                break
            lines.append(pending[at + _LENGTH.size : end].decode("utf-16-le", "replace"))
            at = end
        self._partial = pending[at:]
        return lines

    def close(self) -> list[str]:
        """(Holding ``lock``.) The last lines; the slot goes back to the pool. A line the guest was
        still writing (stopped in ``console.log``) was never logged, and is dropped."""
        lines = self.read()
        if not self.closed:
            self.closed = True
            view, offset = self._region.view, self._offset
            written, _ = _COUNTERS.unpack_from(view, offset)
            if written > (_PAGE - HEADER_BYTES) // 2:  # wrote past the first page: give the others back
                self._region.memory.madvise(mmap.MADV_DONTNEED, offset + _PAGE, SLOT_BYTES - _PAGE)
            if written:  # else the counters are still 0 (read follows written), their page maybe never touched
                _COUNTERS.pack_into(view, offset, 0, 0)
            _free.append((self._region, offset))
        return lines
