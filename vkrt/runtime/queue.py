"""In-flight submission slots on a timeline semaphore: what a submission owns until the GPU is
done with it, and what the host waits for.

Values. Every submission signals the stream's timeline semaphore (Vulkan spec 7.4,
"Semaphores", timeline semaphores, core in 1.2) with the next value 1, 2, 3, ...; submissions
on one queue complete in value order for the host's purposes: a value has signalled once the
GPU finished that submission and every earlier one (signal operations are ordered by
submission order, spec 7.4.1 "Semaphore Signaling" and 7.2 "Implicit Synchronization
Guarantees"). `completed` is the last value the host saw signalled.

Slots. `inflight` slots (VKRT_INFLIGHT) are used round-robin: submission v records into slot
(v - 1) % inflight. A slot owns a command pool and its one primary command buffer, a staging
buffer (host-visible; bump-allocated per submission, for uploads and readbacks of memory the
host cannot map) and, with timestamps, a query pool. Before a slot is recorded into again the
host waits for the value it last submitted: the command buffer, its staging bytes and its
queries are the GPU's until then (spec 6.4 "Command Buffer Lifecycle": a pending command
buffer must not be reset or re-recorded). With `inflight == 1` every submission is waited
for right after it is made: the plain submit-and-wait path.

What waits for what (the host side; device-to-device ordering is the barrier tracker's job,
barriers.py). The stream records, per byte range `(buffer serial, start, end)` it ever bound,
the value of the last submission that wrote it and of the last that read it (`writes_at`,
`reads_at`, updated as records are recorded, with the value the recording batch will signal;
kept by buffer, so that a host access looks at its own buffer's ranges only).
- a host read of a tensor waits for the last writer of an overlapping range;
- a host write into mapped memory waits for the last reader or writer;
- a buffer's free waits for its last use: it is deferred until that value signals (spec,
  vkDestroyBuffer: "All submitted commands that refer to buffer ... must have completed
  execution"), and done by the first host wait that sees the value signalled;
- waiting for the value of the batch being recorded submits it first.
Descriptor sets need no slot of their own: `Pipeline.bind` writes a set once, when it is
allocated for a new tuple of views, and never updates it (pipeline.py), so a set bound by a
pending command buffer is never rewritten (spec 14.2.4 "Descriptor Set Updates": updating a
set a pending command buffer uses invalidates that command buffer). Keep it that way.
Device writes are made visible to the host by a barrier to the HOST stage at the end of every
submission (spec 7.3 "Fences" / 7.4: a wait alone makes nothing visible; "Host Write
Ordering Guarantees" cover the other direction at vkQueueSubmit).
"""
from __future__ import annotations

import time

import numpy as np

from vkrt import config
from vkrt.errors import DeviceLostError, VkrtError
from vkrt.runtime.vk import NULL, check, ffi, lib, new, vk

STAGING_MIN_BYTES = 1 << 20
QUERIES_PER_SLOT = 4096    # timestamps of one submission: its start plus one per record
_WORK_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
UINT64_MAX = 2**64 - 1
# The longest one vkWaitSemaphores call blocks the host (Submitter._block): how late a
# Ctrl-C may be seen while the GPU works.
WAIT_SLICE_S = 0.05
# Command log entries (stream.py): what a command buffer holds, in recording order.
BARRIER, DISPATCH, COPY, HOST_BARRIER = "barrier", "dispatch", "copy", "host_barrier"


_NONE: dict = {}


def mark(table: dict, ranges, value: int) -> None:
    """Record `value` as the last use of each (serial, start, end) of `ranges` in `table`
    (`Submitter.writes_at` / `reads_at`: serial -> {range: value})."""
    for rng in ranges:
        try:
            table[rng[0]][rng] = value
        except KeyError:
            table[rng[0]] = {rng: value}


def timeout_ns(timeout_s: float) -> int:
    """A timeout in seconds as vkWaitSemaphores takes it: nanoseconds in a uint64, where
    UINT64_MAX waits forever (Vulkan spec, vkWaitSemaphores). inf, or anything past 2**64 - 1
    ns (584 years), waits forever."""
    ns = timeout_s * 1e9
    return UINT64_MAX if not ns < UINT64_MAX else max(0, int(ns))


class Slot:
    """One in-flight submission's resources (see the module docstring).

    Attributes: `index`, `cmd` (VkCommandBuffer), `value` (the value it last submitted, 0 if
    never), `staging` (a host-visible Buffer), `staging_used` (bytes handed out in the batch
    being recorded), `readbacks` (Readbacks whose bytes sit in `staging`), `query_pool`,
    `timed` (names of the records timed in its last batch), `submit_ns` (host time of its
    last submit), `commands` (the command log of its batch being recorded, else of its last
    one: "barrier", "dispatch", "copy" entries in recording order, then "host_barrier" once
    ended; see stream.py; a new list per batch)."""

    def __init__(self, device, index: int):
        from vkrt.runtime.memory import Buffer  # memory imports device; avoid a cycle at load

        self.device, self.index = device, index
        self.pool = self.query_pool = self.staging = None
        self.value = 0
        self.staging_used = 0
        self.readbacks: list = []
        self.timed: list[str] = []
        self.commands: list[str] = []
        self.first_name = self.last_name = ""   # the first and last record of its batch
        self.timing = False
        self.submit_ns = 0
        h = device.handle
        info = new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "flags": vk.VK_COMMAND_POOL_CREATE_TRANSIENT_BIT,
            "queueFamilyIndex": device.queue_family})
        out = new("VkCommandPool*")
        check(lib.vkCreateCommandPool(h, info, NULL, out), "vkCreateCommandPool")
        self.pool = out[0]
        alloc = new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, "commandPool": self.pool,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        self.cmds = new("VkCommandBuffer[1]")
        check(lib.vkAllocateCommandBuffers(h, alloc, self.cmds), "vkAllocateCommandBuffers")
        self.cmd = self.cmds[0]
        self.staging = Buffer(device, STAGING_MIN_BYTES, host_visible=True,
                              name=f"staging-{index}")

    def enable_queries(self) -> None:
        if self.query_pool is None:
            info = new("VkQueryPoolCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                "queryType": vk.VK_QUERY_TYPE_TIMESTAMP, "queryCount": QUERIES_PER_SLOT})
            out = new("VkQueryPool*")
            check(lib.vkCreateQueryPool(self.device.handle, info, NULL, out), "vkCreateQueryPool")
            self.query_pool = out[0]
            self._results = np.zeros(QUERIES_PER_SLOT, np.uint64)
            self._results_c = ffi.from_buffer(self._results)

    def query_results(self, n: int) -> np.ndarray:
        """The first `n` timestamps of the last batch in ticks (its value has signalled)."""
        check(lib.vkGetQueryPoolResults(
            self.device.handle, self.query_pool, 0, n, 8 * n, self._results_c, 8,
            vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT), "vkGetQueryPoolResults")
        return self._results[:n].copy()

    def close(self) -> None:
        h = self.device.handle
        if self.staging is not None:
            self.staging.close(drain=False)
            self.staging = None
        if self.query_pool is not None:
            lib.vkDestroyQueryPool(h, self.query_pool, NULL)
            self.query_pool = None
        if self.pool is not None:
            lib.vkDestroyCommandPool(h, self.pool, NULL)
            self.pool = None


class Submitter:
    """The timeline semaphore, the slots, the per-range last-use values and the deferred frees
    of one stream (see the module docstring). The stream records into `slot.cmd` between
    `begin()` and `submit()`.

    Args: device; inflight (slots, >= 1; default VKRT_INFLIGHT); counters, profiler (the
    stream's)."""

    def __init__(self, device, inflight: int, counters, profiler):
        if inflight < 1:
            raise VkrtError(f"VKRT_INFLIGHT must be at least 1, got {inflight}")
        self.device, self.inflight = device, inflight
        self.counters, self.profiler = counters, profiler
        self.submitted = 0        # last value submitted
        self.completed = 0        # last value seen signalled
        self.waited = 0           # last value the host waited for (synchronized with)
        self.recording = False
        self.slot: Slot | None = None
        # serial -> {(serial, start, end): value}: the last value writing / reading each range,
        # by buffer, so that a host access scans only the ranges of its own buffer.
        self.writes_at: dict[int, dict[tuple, int]] = {}
        self.reads_at: dict[int, dict[tuple, int]] = {}
        self.ranges_scanned = 0   # ranges host accesses looked at (tests: no scan of others)
        self.deferred: list[tuple[int, object]] = []   # (value, buffer) to free once signalled
        self.labels: dict[int, tuple] = {}   # value -> (log, first, last record name)
        self.on_complete = None   # called with each slot whose value signalled (timestamps)
        self.on_begin = None      # called with each slot as its batch begins (timestamps)
        self.slots: list[Slot] = []
        self.semaphore = self._gate = None
        self._gate_value = 0
        self.held = 0             # while > 0, submissions wait for the host (tests: hold())
        # vkWaitSemaphores, an attribute so that a test can stand in for a driver's answer
        # (VK_ERROR_DEVICE_LOST) without a device that loses itself.
        self.wait_semaphores = lib.vkWaitSemaphores
        self._create()
        device.add_queue(self)    # Buffer.close asks it about its buffers (Device.retire)

    def _timeline(self):
        type_info = new("VkSemaphoreTypeCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
            "semaphoreType": vk.VK_SEMAPHORE_TYPE_TIMELINE, "initialValue": 0})
        info = new("VkSemaphoreCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, "pNext": type_info})
        out = new("VkSemaphore[1]")
        check(lib.vkCreateSemaphore(self.device.handle, info, NULL, out), "vkCreateSemaphore")
        return out

    def _create(self) -> None:
        self.semaphore = self._timeline()
        self.slots = [Slot(self.device, i) for i in range(self.inflight)]
        # Structs of the submit and wait paths, built once.
        self._begin_info = new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT})
        self._signal_value = new("uint64_t[1]")
        self._gate_wait_value = new("uint64_t[1]")
        self._timeline_info = new("VkTimelineSemaphoreSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
            "signalSemaphoreValueCount": 1, "pSignalSemaphoreValues": self._signal_value,
            "waitSemaphoreValueCount": 0, "pWaitSemaphoreValues": self._gate_wait_value})
        self._wait_stage = new("VkPipelineStageFlags[1]", [vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT])
        self._submit = new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "pNext": self._timeline_info,
            "commandBufferCount": 1, "signalSemaphoreCount": 1,
            "pSignalSemaphores": self.semaphore, "waitSemaphoreCount": 0,
            "pWaitDstStageMask": self._wait_stage})
        self._wait_value = new("uint64_t[1]")
        self._wait_info = new("VkSemaphoreWaitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, "semaphoreCount": 1,
            "pSemaphores": self.semaphore, "pValues": self._wait_value})
        self._counter = new("uint64_t*")
        self._to_host = new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_HOST_READ_BIT})

    @property
    def pending(self) -> int:
        """The value the batch being recorded (or the next one) will signal."""
        return self.submitted + 1

    # -- recording and submission ----------------------------------------------------------
    def begin(self):
        """The command buffer to record into: on the first record of a batch, take the next
        slot, waiting for the value it last submitted, and begin its command buffer."""
        if self.recording:
            return self.slot.cmd
        self.check_lost()
        slot = self.slots[self.submitted % self.inflight]
        if slot.value:
            self.wait(slot.value)
            self.counters.slot_reuses += 1
        for rb in slot.readbacks:   # readbacks nobody collected yet: their bytes leave now
            rb.collect()
        slot.readbacks = []
        slot.staging_used = 0
        check(lib.vkResetCommandPool(self.device.handle, slot.pool, 0), "vkResetCommandPool")
        check(lib.vkBeginCommandBuffer(slot.cmd, self._begin_info), "vkBeginCommandBuffer")
        slot.commands = []        # its log restarts with its command buffer
        slot.first_name = slot.last_name = ""
        self.slot, self.recording = slot, True
        if self.on_begin is not None:
            self.on_begin(slot)
        return slot.cmd

    def submit(self) -> int:
        """End and submit the batch being recorded; return its value (the last submitted
        value when nothing was recorded). Does not wait, unless `inflight == 1`."""
        if not self.recording:
            return self.submitted
        t = time.perf_counter_ns()
        slot = self.slot
        self.end_commands(slot.cmd, slot.commands)
        self.recording = False
        slot.value, slot.submit_ns = self.submitted + 1, t
        return self._queue_submit(slot.cmds, t, (slot.commands, slot.first_name,
                                                 slot.last_name))

    def end_commands(self, cmd, log: list) -> None:
        """End a command buffer with the barrier that makes its writes visible to the host,
        logged as "host_barrier" in `log` (its command log, stream.py)."""
        lib.vkCmdPipelineBarrier(cmd, _WORK_STAGES, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                 self._to_host, 0, NULL, 0, NULL)
        log.append(HOST_BARRIER)
        check(lib.vkEndCommandBuffer(cmd), "vkEndCommandBuffer")

    def submit_recording(self, rec) -> int:
        """Submit a captured `Recording` (replay.py) after anything being recorded; return its
        value. Waits first for its previous submission (a command buffer is not submitted
        again while pending) and for the one `inflight` back (the depth slots keep), and
        collects the readbacks of the recording's previous submission. Its byte ranges are
        marked with the new value, as recorded batches mark theirs."""
        if self.recording:
            self.submit()
        # At most `inflight` submissions in flight, as with slots (a recording owns no slot).
        target = max(rec.value, self.submitted + 1 - self.inflight)
        if target > 0:
            self.wait(target)
        for rb in rec.readbacks:
            rb.collect()
        rec.readbacks = []
        t = time.perf_counter_ns()
        value = rec.value = self.submitted + 1
        mark(self.writes_at, rec.writes, value)
        mark(self.reads_at, rec.reads, value)
        c = self.counters
        c.replays += 1
        c.replayed_dispatches += rec.dispatches
        c.replayed_barriers += rec.barriers
        c.replayed_stages += rec.stages
        return self._queue_submit(rec.cmds, t, (rec.commands, "a replay", rec.last_name))

    def _queue_submit(self, cmds, t: int, label: tuple) -> int:
        """vkQueueSubmit of one ended command buffer signalling the next value; `label`
        (its command log, first and last record names) is what an error names if the device
        is lost while it runs."""
        self.check_lost()
        value = self.submitted + 1
        self.labels[value] = label
        self.labels.pop(value - 2 * self.inflight - 1, None)   # long done: keep a few
        self._signal_value[0] = value
        submit = self._submit
        submit.pCommandBuffers = cmds
        if self.held:
            submit.waitSemaphoreCount = self._timeline_info.waitSemaphoreValueCount = 1
            submit.pWaitSemaphores = self._gate
            self._gate_wait_value[0] = self._gate_value + 1
        try:
            check(lib.vkQueueSubmit(self.device.queue, 1, submit, NULL), "vkQueueSubmit")
        except DeviceLostError:
            self._lost(value, "vkQueueSubmit")
        submit.waitSemaphoreCount = self._timeline_info.waitSemaphoreValueCount = 0
        self.submitted = value
        c = self.counters
        c.submits += 1
        self._poll(value)
        # Pipelining depth as the host sees it: submissions it has not synchronized with.
        # (Whether the GPU kept up is what waits_ready / waits_blocked say; a GPU-side depth
        # would depend on the race between host and GPU, and differ from run to run.)
        c.max_inflight = max(c.max_inflight, value - self.waited)
        self.profiler.add("submit", t)
        if self.inflight == 1:
            self.wait(value)
        return value

    # -- waiting ---------------------------------------------------------------------------
    def wait(self, value: int) -> None:
        """Return once submission `value` (and every earlier one) has completed; `value` of
        the batch being recorded submits it first. Counted as `waits_ready` when it had
        already signalled, else `waits_blocked`. Then frees what was deferred until then.

        Raises: VkrtError after VKRT_FENCE_TIMEOUT_S seconds; ValidationError (validation on)."""
        self.check_lost()
        if value > self.submitted:
            if value > self.pending or not self.recording:
                raise VkrtError(f"waiting for submission {value}: only {self.submitted} made")
            self.submit()
        self.waited = max(self.waited, value)
        if value <= self.completed:
            self.counters.waits_ready += 1
            self._retire()
            return
        self._poll(value)
        if value <= self.completed:
            self.counters.waits_ready += 1
        else:
            t = time.perf_counter_ns()
            self._wait_value[0] = value
            self._block(value)
            self.completed = value
            self.counters.waits_blocked += 1
            self.profiler.add("wait", t)
        self._retire()
        self.device.check_validation()

    def _block(self, value: int) -> None:
        """Block until `value` signals, in vkWaitSemaphores calls of at most WAIT_SLICE_S:
        Python runs signal handlers only between bytecodes of the main thread, so a Ctrl-C
        (KeyboardInterrupt) arrives within one slice instead of when the GPU work ends,
        from the command line and from Python alike. What was submitted stays submitted:
        a later wait waits for it again.

        Raises: VkrtError after VKRT_FENCE_TIMEOUT_S seconds in all."""
        timeout_s = config.FENCE_TIMEOUT_S.value
        deadline = time.monotonic() + timeout_s
        h, info = self.device.handle, self._wait_info
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise VkrtError(f"GPU work did not finish within {timeout_s:g} s "
                                f"(VKRT_FENCE_TIMEOUT_S) on {self.device.name}: waited for "
                                f"submission {value}, {self.completed} done")
            result = self.wait_semaphores(h, info, timeout_ns(min(left, WAIT_SLICE_S)))
            if result != vk.VK_TIMEOUT:
                try:
                    check(result, "vkWaitSemaphores")
                except DeviceLostError:
                    self._lost(value, "vkWaitSemaphores")
                return

    def _poll(self, value: int) -> None:
        """Advance `completed` to the semaphore's value now (`value`: what the caller is
        about to wait for, named if the device is lost)."""
        try:
            check(lib.vkGetSemaphoreCounterValue(self.device.handle, self.semaphore[0],
                                                 self._counter), "vkGetSemaphoreCounterValue")
        except DeviceLostError:
            self._lost(value, "vkGetSemaphoreCounterValue")
        self.completed = max(self.completed, self._counter[0])

    def check_lost(self) -> None:
        """Raise DeviceLostError when the device was lost before: nothing runs on it again."""
        if self.device.lost is not None:
            raise DeviceLostError(f"{self.device.lost}; the device is gone: load the model "
                                  "again")

    def _lost(self, value: int, call: str) -> None:
        """Mark the device lost (VK_ERROR_DEVICE_LOST from `call`) and raise one line that
        names the first unfinished submission up to `value` and what it ran."""
        first = min(self.completed + 1, value)
        log, first_name, last_name = self.labels.get(first, ([], "?", "?"))
        what = (f"{log.count(DISPATCH)} dispatches and {log.count(COPY)} copies, "
                f"{first_name} .. {last_name}")
        self.device.lost = (f"{self.device.name}: device lost (VK_ERROR_DEVICE_LOST from "
                            f"{call}) while running submission {first} of {self.submitted} "
                            f"({what}); a desktop driver's watchdog ends a submission that "
                            f"runs too long: a smaller --batch-size or VKRT_PREFILL_FLUSH "
                            f"splits the work")
        raise DeviceLostError(self.device.lost) from None

    def _retire(self) -> None:
        """Free deferred buffers and hand finished slots to `on_complete` (timestamps)."""
        done = self.completed
        if self.deferred and self.deferred[0][0] <= done:
            keep = []
            for value, buffer in self.deferred:
                if value <= done:
                    self.forget(buffer.serial)
                    buffer.destroy()
                    self.counters.deferred_freed += 1
                else:
                    keep.append((value, buffer))
            self.deferred = keep
        if self.on_complete is not None:
            for slot in self.slots:
                if slot.timing and slot.value <= done:
                    self.on_complete(slot)

    def synchronize(self) -> None:
        """Submit what is recorded and wait for every submission (drains)."""
        self.wait(self.pending if self.recording else self.submitted)

    # -- host-access bookkeeping -----------------------------------------------------------
    def _last(self, table: dict, rng: tuple) -> int:
        serial, start, end = rng
        ranges = table.get(serial, _NONE)
        self.ranges_scanned += len(ranges)
        best = 0
        for r, v in ranges.items():
            if r[1] < end and start < r[2] and v > best:
                best = v
        return best

    def last_write(self, rng: tuple) -> int:
        """The value of the last submission (or of the batch being recorded) writing bytes of
        `rng` (serial, start, end); 0 when none did."""
        return self._last(self.writes_at, rng)

    def last_use(self, rng: tuple) -> int:
        """Like `last_write`, for reads and writes."""
        return max(self._last(self.writes_at, rng), self._last(self.reads_at, rng))

    def last_use_of(self, serial: int) -> int:
        """The last value that read or wrote any byte of buffer `serial` (0: none)."""
        return max([*self.writes_at.get(serial, _NONE).values(),
                    *self.reads_at.get(serial, _NONE).values(), 0])

    def forget(self, serial: int) -> None:
        self.writes_at.pop(serial, None)
        self.reads_at.pop(serial, None)

    def pending_use_of(self, serial: int) -> int:
        """The last submission value naming buffer `serial`, or 0 when every use completed."""
        v = self.last_use_of(serial)
        return v if v > self.completed else 0

    def defer_free(self, buffer, value: int) -> None:
        """Destroy `buffer` once `value` has signalled (now if it has)."""
        if value <= self.completed:
            self.forget(buffer.serial)
            buffer.destroy()
            return
        self.deferred.append((value, buffer))
        self.deferred.sort(key=lambda vb: vb[0])
        self.counters.deferred_frees += 1

    def stage(self, nbytes: int):
        """(staging buffer, offset) of `nbytes` free bytes in the recording slot's staging,
        valid until the slot is reused. A batch whose staging is full is submitted first;
        staging too small for one request is replaced (the old one freed once unused)."""
        from vkrt.runtime.memory import Buffer

        self.begin()
        slot = self.slot
        aligned = -(-nbytes // 256) * 256
        if slot.staging_used + aligned > slot.staging.nbytes and slot.staging_used:
            self.submit()
            self.begin()
            slot = self.slot
        if aligned > slot.staging.nbytes:
            old = slot.staging
            slot.staging = Buffer(self.device, max(aligned, 2 * old.nbytes), host_visible=True,
                                  name=old.name)
            self.defer_free(old, slot.value)   # nothing of this batch names it yet
        offset = slot.staging_used
        slot.staging_used += aligned
        return slot.staging, offset

    # -- tests -----------------------------------------------------------------------------
    def hold(self) -> None:
        """For tests: submissions made from now until `release()` wait for the host before
        they start (a wait on a second timeline semaphore), so the host provably runs ahead
        of the GPU."""
        if self._gate is None:
            self._gate = self._timeline()
        self.held += 1

    def release(self) -> None:
        """Let the held submissions run (host-side vkSignalSemaphore; callable from another
        thread, which only touches the gate semaphore)."""
        self.held = 0
        self._gate_value += 1
        info = new("VkSemaphoreSignalInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO, "semaphore": self._gate[0],
            "value": self._gate_value})
        check(lib.vkSignalSemaphore(self.device.handle, info), "vkSignalSemaphore")

    def close(self) -> None:
        """Wait for the queue, free what was deferred, destroy slots and semaphores."""
        self.device.remove_queue(self)
        h = self.device.handle
        self.recording = False
        if self.held:
            self.release()
        if h is not None:
            # Returns at once, VK_ERROR_DEVICE_LOST, on a lost device (spec: vkQueueWaitIdle).
            lib.vkQueueWaitIdle(self.device.queue)
        for _, buffer in self.deferred:
            buffer.destroy()
        self.deferred = []
        for slot in self.slots:
            slot.close()
        self.slots = []
        for sem in (self.semaphore, self._gate):
            if sem is not None:
                lib.vkDestroySemaphore(h, sem[0], NULL)
        self.semaphore = self._gate = None
