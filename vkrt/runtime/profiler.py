"""Counters and a host-phase profiler: every mechanism of the stream is observable, and tests
assert on these numbers, not only on computed values."""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields


@dataclass
class Counters:
    """Monotonic event counts of one stream."""
    dispatches: int = 0
    copies: int = 0            # transfers (staging uploads and readbacks)
    barriers: int = 0          # pipeline barriers recorded before dispatches and copies
    barriers_raw: int = 0      # ... by the cause the tracker proved (barriers.py)
    barriers_waw: int = 0
    barriers_war: int = 0
    barriers_transfer: int = 0
    stages: int = 0            # dependent stages: barrier-separated groups of records
    submits: int = 0           # vkQueueSubmit calls
    fence_waits: int = 0       # host waits on a fence (each drains the queue)
    descriptor_sets: int = 0   # descriptor sets written (cache misses)
    host_reads: int = 0        # buffers read back to the host
    host_writes: int = 0       # buffers written from the host
    read_bytes: int = 0
    write_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def since(self, before: dict[str, int]) -> dict[str, int]:
        """The counts accumulated since `before` (a `snapshot()`)."""
        return {k: v - before[k] for k, v in self.snapshot().items()}


@dataclass
class Profiler:
    """Host time per phase in nanoseconds: build (a model making its list of dispatches),
    record (recording them), submit, wait (blocked on a fence), transfer (host copies).
    Phases are added at batch granularity."""
    phases_ns: dict[str, int] = field(default_factory=dict)

    def add(self, phase: str, start_ns: int) -> int:
        """Charge the time since `start_ns` to `phase`; return now (to chain phases)."""
        now = time.perf_counter_ns()
        self.phases_ns[phase] = self.phases_ns.get(phase, 0) + now - start_ns
        return now

    def report(self) -> str:
        total = sum(self.phases_ns.values()) or 1
        return "  ".join(f"{k} {v / 1e6:.1f} ms ({100 * v / total:.0f}%)"
                         for k, v in sorted(self.phases_ns.items(), key=lambda kv: -kv[1]))
