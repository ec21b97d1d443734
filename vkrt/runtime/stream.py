"""`Stream`: where a list of records (dispatches, copies) is recorded, captured and replayed, and
where the barrier tracker is consulted; the host's access to tensors is its `HostTransfers`
(transfer.py), whose copies through staging it records.

Records go into the command buffer of the current in-flight slot (`queue.py`); `submit()`
sends the batch and returns its timeline value without waiting (with VKRT_INFLIGHT=1 it
waits: the plain path). Host reads and writes wait only for the submissions they depend on
(`queue.py` says what waits for what); `synchronize()` (alias `finish()`) drains everything.
Before each record the tracker (`barriers.py`) decides whether a pipeline barrier must
precede it, from the byte ranges the record reads and writes; its pending accesses survive
submissions, so the first dependent record of a later batch gets the barrier.

With timestamps on (VKRT_TIMESTAMPS=1, or `start_trace()`), each slot's batch writes a
timestamp at its start and one after every record (`vkCmdWriteTimestamp`, Vulkan spec 17.5
"Timestamp Queries"), so record i ran between timestamps i and i + 1 (a record that runs
concurrently with the previous ones is charged only what it adds); timestamps.py begins and
collects them, `_encode` writes the ones after records.

Command log. Every pipeline barrier the stream records goes through `Stream._cmd_barrier`,
which records it, logs it and counts it in one place; `_encode` logs each dispatch and copy
next to its vkCmdDispatch / vkCmdCopyBuffer. A command buffer's log (`Slot.commands` for a
batch, `Recording.commands` for a capture) is what it holds in order: BARRIER (the full
compute/transfer barrier), DISPATCH, COPY, and HOST_BARRIER last (`Submitter.end_commands`).
Binds, push constants, query resets and timestamp writes are not logged.
"""
from __future__ import annotations

import itertools
import time
from typing import Iterable

import numpy as np

from vkrt import config
from vkrt.errors import VkrtError
from vkrt.runtime.barriers import CAUSES, Tracker
from vkrt.runtime.device import Device
from vkrt.runtime.dispatch import Copy, Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.profiler import Counters, Profiler
from vkrt.runtime.queue import BARRIER, COPY, DISPATCH, QUERIES_PER_SLOT, Submitter
from vkrt.runtime.replay import Recording
from vkrt.runtime.tensor import Tensor
from vkrt.runtime.timestamps import Timestamps
from vkrt.runtime.transfer import HostTransfers, Readback
from vkrt.runtime.vk import NULL, check, ffi, lib, new, vk

_ALL_ACCESS = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
               | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
_WORK_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT


_CAUSE_COUNTER = {c: "barriers_" + c.lower() for c in CAUSES}  # Counters field per cause
# A process-unique number per stream: what keys its recordings (an id() is reused once a
# stream is freed, a serial never).
_serials = itertools.count()


def _hulls(ranges) -> list[tuple[int, int, int]]:
    """One (serial, first start, last end) per buffer serial of `ranges`."""
    hull: dict[int, tuple[int, int, int]] = {}
    for serial, start, end in ranges:
        old = hull.get(serial)
        hull[serial] = (serial, start, end) if old is None else (
            serial, min(old[1], start), max(old[2], end))
    return list(hull.values())


class Stream:
    """Records dispatches and copies on `device`'s compute queue.

    Args:
        barriers: "tracked" or "always" (default: VKRT_BARRIERS, see `barriers.py`).
        inflight: submission slots, >= 1 (default: VKRT_INFLIGHT, see `queue.py`).
        timestamps: time every record with timestamp queries (default: VKRT_TIMESTAMPS;
            ignored on a queue without timestamp support).
    Attributes: `counters` (Counters), `profiler` (Profiler: host phases, GPU times per
        record name, trace events), `tracker` (Tracker), `queue` (Submitter), `inflight`.
    Raises: VkrtError for inflight < 1.
    """

    def __init__(self, device: Device, barriers: str | None = None, inflight: int | None = None,
                 timestamps: bool | None = None):
        self.device = device
        self.serial = next(_serials)
        self.tracker = Tracker(always=(barriers or config.BARRIERS.value) == "always")
        self._new_batch = True
        self.counters, self.profiler = Counters(), Profiler()
        self.inflight = config.INFLIGHT.value if inflight is None else int(inflight)
        self.queue = None
        self.timestamps = Timestamps(device, self.counters, self.profiler)
        self._replayed = False          # a replay ran since the last record (record())
        self._recordings: list[Recording] = []
        try:
            self.queue = Submitter(device, self.inflight, self.counters, self.profiler)
            self.queue.on_complete = self.timestamps.collect
            self.queue.on_begin = self._on_begin
            self.host = HostTransfers(device, self.queue, self.record)
        except BaseException:
            self.close()
            raise
        self._full = new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": _ALL_ACCESS})
        self._copy = new("VkBufferCopy*")
        device.adopt(self)
        if config.TIMESTAMPS.value if timestamps is None else timestamps:
            self.enable_timestamps()

    # -- recording -------------------------------------------------------------------------
    def _on_begin(self, slot) -> None:
        """A batch begins in `slot` (its command buffer is recording)."""
        self._new_batch = True
        self.timestamps.begin(slot)

    def record(self, records: Iterable[Dispatch | Copy], flush_every: int = 0) -> None:
        """Record `records` in order, each behind a pipeline barrier when the tracker proves
        a dependency on pending work. Nothing is submitted, except with `flush_every`: then
        every `flush_every` records (not after the last) the batch is submitted, so the GPU
        runs the first records of a long list (a prefill) while the host records the rest.
        The first record after a replay gets a full barrier (the tracker did not see what
        the replay ran).

        Raises: ShaderInterfaceError when a view breaks a device limit (`Pipeline.bind`)."""
        if flush_every:
            records = list(records)
            for i in range(0, len(records), flush_every):
                if i:
                    self.submit()
                self.record(records[i:i + flush_every])
            return
        t0 = time.perf_counter_ns()
        q = self.queue
        if self._replayed:
            # The tracker never saw the replay's accesses: a full barrier orders everything
            # submitted before (the replay included) before this batch (spec 7.6 "Pipeline
            # Barriers": the first synchronization scope covers all earlier commands in
            # submission order). It is the batch's first logged command (`commands`).
            self._replayed = False
            self.barrier()
        cmd = q.begin()
        slot = q.slot
        first, last = self._encode(cmd, slot.commands, records, self.tracker, q.pending,
                                   q.writes_at, q.reads_at, slot.timed if slot.timing else None,
                                   slot.query_pool)
        slot.first_name, slot.last_name = slot.first_name or first, last or slot.last_name
        self.profiler.add("record", t0)

    def _cmd_barrier(self, cmd, log: list) -> None:
        """Record the full barrier into `cmd` (every compute and transfer write before it
        available and visible to every compute and transfer access after it: Vulkan spec 7.6
        "Pipeline Barriers", 7.6.1 "Global Memory Barriers"), append BARRIER to `log` (that
        command buffer's log) and count it in `counters.barriers`. The one place the stream
        records a pipeline barrier, so the log and the counter cannot miss one."""
        lib.vkCmdPipelineBarrier(cmd, _WORK_STAGES, _WORK_STAGES, 0, 1, self._full,
                                 0, NULL, 0, NULL)
        log.append(BARRIER)
        self.counters.barriers += 1

    def _encode(self, cmd, log: list, records, tracker: Tracker, value: int, writes_at: dict,
                reads_at: dict, timed: list | None = None,
                query_pool=None) -> tuple[str, str]:
        """Record into `cmd`: barriers as `tracker` decides, each record's byte ranges marked
        with `value` in `writes_at` / `reads_at` (serial -> {range: value}, what host accesses
        wait for; the loop inlines `queue.mark`); each barrier,
        dispatch and copy appended to `log`, the command buffer's log. Returns the names of
        the first and last record ("" when none)."""
        counters = self.counters
        first = r = None
        compute = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        log_append = log.append
        for r in records:
            if r.transfer:
                self._copy.srcOffset, self._copy.dstOffset = r.src.offset, r.dst.offset
                self._copy.size = r.src.nbytes
            else:
                bound = r.pipeline.bind(r.tensors, counters)
            barrier, cause = tracker.before(r)
            if barrier:
                self._cmd_barrier(cmd, log)
                if cause is not None:
                    name = _CAUSE_COUNTER[cause]
                    setattr(counters, name, getattr(counters, name) + 1)
            if barrier or self._new_batch:
                counters.stages += 1
                self._new_batch = False
            for rng in r.writes:          # what a host access will wait for (queue.py)
                try:
                    writes_at[rng[0]][rng] = value
                except KeyError:
                    writes_at[rng[0]] = {rng: value}
            for rng in r.reads:
                try:
                    reads_at[rng[0]][rng] = value
                except KeyError:
                    reads_at[rng[0]] = {rng: value}
            if r.transfer:
                lib.vkCmdCopyBuffer(cmd, r.src.buffer.handle, r.dst.buffer.handle, 1, self._copy)
                log_append(COPY)
                counters.copies += 1
            else:
                p = r.pipeline
                lib.vkCmdBindPipeline(cmd, compute, p.handle)
                lib.vkCmdBindDescriptorSets(cmd, compute, p.layout, 0, 1, bound, 0, NULL)
                if r.push:
                    # A cffi view made once per record: cffi converting the bytes object at
                    # every call cost ~65 us per dispatch on lavapipe's host, against ~2 us.
                    if r.push_c is None:
                        r.push_c = ffi.from_buffer(r.push)
                    lib.vkCmdPushConstants(cmd, p.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                           len(r.push), r.push_c)
                lib.vkCmdDispatch(cmd, *r.grid)
                log_append(DISPATCH)
                counters.dispatches += 1
            if timed is not None and len(timed) + 1 < QUERIES_PER_SLOT:
                timed.append(r.name)
                lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                        query_pool, len(timed))
            if first is None:
                first = r
        return (first.name, r.name) if first is not None else ("", "")

    @property
    def commands(self) -> list[str]:
        """The command log of the batch being recorded, else of the last batch recorded
        (`Slot.commands`; the module docstring says what it holds); [] before any batch."""
        slot = self.queue.slot
        return slot.commands if slot is not None else []

    # -- capture and replay (replay.py) ------------------------------------------------------
    def capture(self, records: list, readback: Tensor | None = None, key=None) -> Recording:
        """Record `records` once into a new `Recording` that `replay` submits again and
        again: a full barrier first, then the records with barriers decided by a tracker of
        the stream's policy that starts empty; with `readback` (a tensor the host cannot map),
        a copy of it into the recording's own staging at the end. The counters count the
        capture's dispatches and barriers once (and `captures`); replays record nothing.
        `key`: anything the caller compares to know when to capture again."""
        t0 = time.perf_counter_ns()
        records = list(records)         # read twice: recorded, then the buffers they name
        rec = Recording(self.device, key)
        new_batch = self._new_batch     # the stream's own batch is not this one
        try:
            if readback is not None and readback.buffer.mapped is None:
                rec.staging = Buffer(self.device, max(readback.nbytes, 4), host_visible=True,
                                     name="replay-staging")
                records = list(records) + [Copy(readback, Tensor(
                    rec.staging, 0, readback.nbytes, readback.dtype, readback.shape), "readback")]
            info = new("VkCommandBufferBeginInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
            check(lib.vkBeginCommandBuffer(rec.cmd, info), "vkBeginCommandBuffer")
            before = self.counters.snapshot()
            # First command: orders the whole recording after everything submitted before
            # each of its submissions (spec 7.6: a barrier's first synchronization scope is
            # every command earlier in submission order, across command buffers).
            self._cmd_barrier(rec.cmd, rec.commands)
            self._new_batch = True
            writes, reads = {}, {}
            _, rec.last_name = self._encode(rec.cmd, rec.commands, records,
                                            Tracker(always=self.tracker.always), 0, writes, reads)
            self.queue.end_commands(rec.cmd, rec.commands)
        except BaseException:
            rec.close()
            raise
        finally:
            self._new_batch = new_batch
        done = self.counters.since(before)
        rec.dispatches, rec.stages = done["dispatches"], done["stages"]
        rec.barriers = done["barriers"]
        # Writes stay exact: a host read waits for the last replay that wrote its bytes,
        # and a token slot must not wait for the replay writing the next slot. Reads are
        # kept as one hull per buffer (the weights' hundreds of views become one range): a
        # host write then waits for every replay that read any byte of that buffer, which
        # can only wait longer, and each replay marks a few ranges instead of hundreds.
        rec.writes = [rng for ranges in writes.values() for rng in ranges]
        rec.reads = _hulls(rng for ranges in reads.values() for rng in ranges)
        rec.buffers = list({id(t.buffer): t.buffer for r in records
                            for t in ((r.src, r.dst) if r.transfer else r.tensors)}.values())
        self.counters.captures += 1
        self._recordings.append(rec)
        self.profiler.add("record", t0)
        return rec

    def replay(self, rec: Recording, readback: Tensor | None = None) -> Readback | None:
        """Submit `rec` (after whatever is recorded) and return a `Readback` of `readback`
        (the tensor given at capture, or a mapped one) as that submission leaves it. Nothing
        is recorded; the next `record` starts with a full barrier.

        Raises: VkrtError, before submitting, when a buffer the recording names was closed
        since the capture (it must be captured again)."""
        for b in rec.buffers:
            if b.closed:
                raise VkrtError(f"replaying a recording keyed {rec.key!r}: it names buffer "
                                f"{b.name!r}, closed since the capture (capture it again)")
        value = self.queue.submit_recording(rec)
        self._replayed = True
        if readback is None:
            return None
        if rec.staging is not None:
            rb = Readback(self.queue, readback, value, rec, 0)
            rec.readbacks.append(rb)
            return rb
        return Readback(self.queue, readback, value)

    def drop(self, rec: Recording) -> None:
        """Free a recording once its last submission is done (before capturing again)."""
        if rec.value:
            self.queue.wait(rec.value)
        rec.close()
        self._recordings.remove(rec)

    def barrier(self) -> None:
        """Record a full pipeline barrier: everything recorded or submitted before it is
        ordered before everything after, and nothing is pending any more (counted in
        `counters.barriers`, under no cause)."""
        q = self.queue
        cmd = q.begin()
        self._cmd_barrier(cmd, q.slot.commands)
        self.tracker.clear()

    # -- submission ------------------------------------------------------------------------
    def submit(self) -> int:
        """Submit what was recorded; return the submission's timeline value (the last value
        when nothing was recorded). Waits only for a slot to reuse, or, with inflight == 1,
        for the submission itself. The tracker keeps its pending accesses (barriers.py)."""
        return self.queue.submit()

    def wait(self, value: int) -> None:
        """Wait until submission `value` has completed (see `Submitter.wait`)."""
        self.queue.wait(value)

    def synchronize(self) -> None:
        """Submit what was recorded and wait until the GPU has executed everything (drains)."""
        self.queue.synchronize()

    finish = synchronize

    @property
    def submitted(self) -> int:
        return self.queue.submitted

    def last_write(self, rng: tuple) -> int:
        return self.queue.last_write(rng)

    # -- host access (transfer.py) ---------------------------------------------------------
    def read_later(self, t: Tensor) -> Readback:
        """`HostTransfers.read_later`."""
        return self.host.read_later(t)

    def read(self, t: Tensor) -> np.ndarray:
        """`HostTransfers.read`."""
        return self.host.read(t)

    def write(self, t: Tensor, array: np.ndarray) -> None:
        """`HostTransfers.write`."""
        self.host.write(t, array)

    def upload(self, array: np.ndarray, name: str = "") -> Tensor:
        """`HostTransfers.upload`."""
        return self.host.upload(array, name)

    # -- timestamps and trace --------------------------------------------------------------
    def enable_timestamps(self) -> bool:
        """`Timestamps.enable`: time every record from the next batch on."""
        return self.timestamps.enable()

    @property
    def timing(self) -> bool:
        """Whether the next batches are timed (`Timestamps.on`)."""
        return self.timestamps.on

    @timing.setter
    def timing(self, on: bool) -> None:
        self.timestamps.on = on

    def start_trace(self) -> bool:
        """Keep host phases and (where supported) per-dispatch GPU times as trace events from
        now on; `write_trace(path)` writes them. Returns whether GPU times are recorded."""
        self.profiler.events = []
        self.profiler.gpu_events = []
        return self.enable_timestamps()

    def write_trace(self, path) -> dict:
        """Write the trace events kept since `start_trace()` as a Chrome trace event file
        (JSON, opens in Perfetto): host phases on one track, GPU records on another.
        Synchronizes first. Returns the written object."""
        from vkrt.runtime.trace import write_chrome_trace

        self.synchronize()
        return write_chrome_trace(path, self.profiler, self.device.name,
                                  self.timestamps.calibration_name())

    # -- tests -----------------------------------------------------------------------------
    def hold(self) -> None:
        """For tests: submissions wait for `release()` before they start (queue.py)."""
        self.queue.hold()

    def release(self) -> None:
        self.queue.release()

    def close(self) -> None:
        """Discard anything recorded but not submitted, wait for the queue, free what was
        deferred, and destroy the slots (command pools, staging, query pools)."""
        if self.queue is not None:
            self.queue.close()
            self.queue = None
        for rec in self._recordings:
            rec.close()
        self._recordings = []
        self.device.release(self)
