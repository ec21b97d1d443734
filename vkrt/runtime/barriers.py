"""Barrier policies: given a dispatch's read and write sets, decide whether a pipeline barrier
must precede it. The stream asks; the policy decides. This is the one replaceable piece.

`FullBarrier` (the first slice) answers yes before every dispatch: always correct, and the
slowest possible policy (a dispatch behind a barrier costs ~3.2 us of GPU time on the H200,
shared/FACTS.md). A dependency tracker that proves RAW/WAW/WAR hazards replaces it later.
"""
from __future__ import annotations


class FullBarrier:
    """A global memory barrier (compute/transfer writes -> compute/transfer reads and writes)
    before every dispatch."""

    def before_dispatch(self, reads: tuple, writes: tuple) -> bool:
        """Return True when a barrier must be recorded before a dispatch that reads the buffers
        `reads` and writes `writes` (tuples of Buffer serials)."""
        return True

    def reset(self) -> None:
        """Forget recorded accesses: called when the queue is idle (after a fence wait)."""
