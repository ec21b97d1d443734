"""Counters and a host-phase profiler: every mechanism of the stream is observable, and tests
assert on these numbers, not only on computed values. With timestamps on, GPU time per record
name; with a trace started, the events `trace.py` writes."""
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
    submits: int = 0           # vkQueueSubmit calls (one per batch, one timeline value each)
    captures: int = 0          # record lists captured into a Recording (replay.py)
    replays: int = 0           # ... submissions of a Recording (nothing recorded for them)
    replayed_dispatches: int = 0   # dispatches, barriers and stages those replays ran (each
    replayed_barriers: int = 0     # adds its recording's counts from the capture): the work
    replayed_stages: int = 0       # a replay hides from the counters above
    waits_blocked: int = 0     # host waits for a submission value that had not signalled
    waits_ready: int = 0       # host waits whose value had already signalled (no blocking)
    max_inflight: int = 0      # high-water mark: most submissions the host had not waited for,
                               # at a submit (its pipelining depth)
    slot_reuses: int = 0       # a slot recorded into again (after its last value signalled)
    deferred_frees: int = 0    # buffer frees deferred until their last use completes
    deferred_freed: int = 0    # ... and done
    timestamps: int = 0        # records timed with timestamp queries
    descriptor_sets: int = 0   # descriptor sets written (cache misses)
    host_reads: int = 0        # buffers read back to the host
    host_writes: int = 0       # buffers written from the host
    read_bytes: int = 0
    write_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def since(self, before: dict[str, int]) -> dict[str, int]:
        """The counts accumulated since `before` (a `snapshot()`); for a high-water mark
        (`max_inflight`) its current value (set it to 0 to measure a window)."""
        return {k: v if k in _MARKS else v - before[k] for k, v in self.snapshot().items()}


_MARKS = ("max_inflight",)


@dataclass
class Profiler:
    """Host time per phase in nanoseconds: build (a model making its list of dispatches),
    record (recording them), submit, wait (blocked on a submission), transfer (host copies).
    Phases are added at batch granularity.

    `gpu_ns` / `gpu_count`: GPU time and count per record name (`blk.3.ffn_down`) from
    timestamp queries. `events` / `gpu_events`: lists of (name, start ns, end ns) on the host
    clock (perf_counter_ns), kept only after `Stream.start_trace()` (None otherwise)."""
    phases_ns: dict[str, int] = field(default_factory=dict)
    gpu_ns: dict[str, float] = field(default_factory=dict)
    gpu_count: dict[str, int] = field(default_factory=dict)
    events: list | None = None
    gpu_events: list | None = None

    def add(self, phase: str, start_ns: int) -> int:
        """Charge the time since `start_ns` to `phase`; return now (to chain phases)."""
        now = time.perf_counter_ns()
        self.phases_ns[phase] = self.phases_ns.get(phase, 0) + now - start_ns
        if self.events is not None:
            self.events.append((phase, start_ns, now))
        return now

    def add_gpu(self, names: list[str], t0_ns: float, rel_ns) -> None:
        """Record i of a batch ran from rel_ns[i] to rel_ns[i + 1] after the batch's start,
        which is `t0_ns` on the host clock."""
        gpu_ns, gpu_count, events = self.gpu_ns, self.gpu_count, self.gpu_events
        for i, name in enumerate(names):
            start, end = rel_ns[i], rel_ns[i + 1]
            gpu_ns[name] = gpu_ns.get(name, 0.0) + (end - start)
            gpu_count[name] = gpu_count.get(name, 0) + 1
            if events is not None:
                events.append((name, t0_ns + start, t0_ns + end))

    def report(self) -> str:
        total = sum(self.phases_ns.values()) or 1
        return "  ".join(f"{k} {v / 1e6:.1f} ms ({100 * v / total:.0f}%)"
                         for k, v in sorted(self.phases_ns.items(), key=lambda kv: -kv[1]))

    def gpu_report(self, top: int = 10) -> str:
        """The `top` record names by total GPU time: name total ms (count)."""
        rows = sorted(self.gpu_ns.items(), key=lambda kv: -kv[1])[:top]
        return "  ".join(f"{k} {v / 1e6:.2f} ms ({self.gpu_count[k]})" for k, v in rows)
