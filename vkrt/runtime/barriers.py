"""Where a barrier is decided: the dependency tracker.

Rule (the seed's tracker; tinygrad's `DepsTracker` keys on ranges the same way): accesses are
byte ranges `(buffer serial, start, end)`. Before record j, a pipeline barrier is needed iff some
record i since the last barrier
- wrote bytes that j reads (read-after-write, RAW),
- wrote bytes that j writes (write-after-write, WAW: without a barrier the two writes may land
  in either order),
- read bytes that j writes (write-after-read, WAR: j could overwrite them before i read them).
Two dispatches that only read the same bytes never need one. A barrier is a global memory
barrier with an execution dependency between the compute and transfer stages (Vulkan spec 7.7.1
"Global Memory Barriers"); it orders everything earlier in submission order on the queue
against everything later, so recording one clears the pending accesses. Pending accesses
survive the end of a command buffer and a submission: work submitted earlier may still be
running when a later submission starts (spec 7.2, "Implicit Synchronization Guarantees" gives
none between submissions), so the first dependent record of the next batch gets the barrier.

A barrier is counted by cause: `RAW`, `WAW`, `WAR`, or `transfer` when either side of the
dependency is a copy. `VKRT_BARRIERS=always` records a barrier before every record (the first
slice's policy, a correctness fallback); the cause is still counted when there is one.
"""
from __future__ import annotations

from typing import Iterable

CAUSES = ("RAW", "WAW", "WAR", "transfer")


def _overlaps(ranges, start: int, end: int):
    """The first pending (start, end, transfer) in `ranges` sharing a byte with [start, end)."""
    for r in ranges:
        if r[0] < end and start < r[1]:
            return r
    return None


class Tracker:
    """Pending reads and writes since the last barrier, per buffer serial.

    Args:
        always: barrier before every record (VKRT_BARRIERS=always).
    """

    def __init__(self, always: bool = False):
        self.always = always
        self._reads: dict[int, list] = {}
        self._writes: dict[int, list] = {}

    def hazard(self, reads: Iterable, writes: Iterable, transfer: bool = False) -> str | None:
        """The cause of the dependency of a record reading `reads` and writing `writes` (byte
        ranges) on the pending accesses, or None when it has none."""
        pending_w, pending_r = self._writes, self._reads
        for serial, start, end in reads:
            hit = _overlaps(pending_w.get(serial, ()), start, end)
            if hit:
                return "transfer" if transfer or hit[2] else "RAW"
        for serial, start, end in writes:
            hit = _overlaps(pending_w.get(serial, ()), start, end)
            if hit:
                return "transfer" if transfer or hit[2] else "WAW"
            hit = _overlaps(pending_r.get(serial, ()), start, end)
            if hit:
                return "transfer" if transfer or hit[2] else "WAR"
        return None

    def before(self, record) -> tuple[bool, str | None]:
        """Decide for `record` (a Dispatch or Copy) and note its accesses as pending:
        returns (barrier needed, cause or None). A barrier clears what was pending."""
        reads, writes = record.reads, record.writes
        cause = self.hazard(reads, writes, record.transfer)
        barrier = self.always or cause is not None
        if barrier:
            self.clear()
        for serial, start, end in reads:
            self._reads.setdefault(serial, []).append((start, end, record.transfer))
        for serial, start, end in writes:
            self._writes.setdefault(serial, []).append((start, end, record.transfer))
        return barrier, cause

    def clear(self) -> None:
        """Forget every pending access: a full barrier was recorded."""
        self._reads, self._writes = {}, {}

    def pending(self) -> int:
        """Number of accesses recorded since the last barrier."""
        return sum(map(len, self._reads.values())) + sum(map(len, self._writes.values()))


def plan(records: Iterable, tracker: Tracker | None = None) -> list[str | None]:
    """The barrier decision before each record, without a device: per record None (no
    barrier), a cause, or "always" for a barrier `always` adds without a dependency.
    Pass one `tracker` to several calls to plan consecutive batches (submissions)."""
    tracker = tracker or Tracker()
    out = []
    for record in records:
        barrier, cause = tracker.before(record)
        out.append(cause or ("always" if barrier else None))
    return out


def stages(decisions: list[str | None]) -> int:
    """Dependent stages of a planned list: the records that start a new barrier-separated
    group (every barrier, and the first record when it has none)."""
    if not decisions:
        return 0
    return sum(d is not None for d in decisions) + (decisions[0] is None)
