"""`Stream`: where a list of records (dispatches, copies) is recorded, where the barrier tracker
is consulted, where batches are submitted and where the host waits.

One command buffer, one fence: records are recorded until a host access (`read`, `write`) or
`finish()` ends the batch, submits it and waits on the fence. Before each record the tracker
(`barriers.py`) decides whether a pipeline barrier must precede it, from the byte ranges the
record reads and writes; its pending accesses survive the submission.
"""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np

from vkrt import config
from vkrt.errors import VkrtError
from vkrt.runtime.barriers import Tracker
from vkrt.runtime.device import Device
from vkrt.runtime.dispatch import Copy, Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.profiler import Counters, Profiler
from vkrt.runtime.tensor import Tensor
from vkrt.runtime.vk import NULL, check, ffi, lib, new, vk

STAGING_MIN_BYTES = 1 << 20
UINT64_MAX = 2**64 - 1
_ALL_ACCESS = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
               | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
_WORK_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT


def timeout_ns(timeout_s: float) -> int:
    """A timeout in seconds as vkWaitForFences takes it: nanoseconds in a uint64, where
    UINT64_MAX waits forever (Vulkan spec, vkWaitForFences). inf, or anything past 2**64 - 1
    ns (584 years), waits forever."""
    ns = timeout_s * 1e9
    return UINT64_MAX if not ns < UINT64_MAX else max(0, int(ns))


class Stream:
    """Records dispatches and copies on `device`'s compute queue.

    Args:
        barriers: "tracked" or "always" (default: VKRT_BARRIERS, see `barriers.py`).
    Attributes: `counters` (Counters), `profiler` (Profiler), `tracker` (Tracker).
    """

    def __init__(self, device: Device, barriers: str | None = None):
        self.device = device
        self.tracker = Tracker(always=(barriers or config.BARRIERS.value) == "always")
        self._new_batch = True
        self.counters, self.profiler = Counters(), Profiler()
        self.pool = self.fence = None
        self._staging: dict[str, Buffer] = {}
        self._recording = False
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        device.adopt(self)

    def _create(self) -> None:
        device, h = self.device, self.device.handle
        info = new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "flags": vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            "queueFamilyIndex": device.queue_family})
        out = new("VkCommandPool*")
        check(lib.vkCreateCommandPool(h, info, NULL, out), "vkCreateCommandPool")
        self.pool = out[0]
        alloc = new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, "commandPool": self.pool,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        self._cmd = new("VkCommandBuffer[1]")
        check(lib.vkAllocateCommandBuffers(h, alloc, self._cmd), "vkAllocateCommandBuffers")
        self.cmd = self._cmd[0]
        fence_info = new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        fence = new("VkFence[1]")
        check(lib.vkCreateFence(h, fence_info, NULL, fence), "vkCreateFence")
        self._fence, self.fence = fence, fence[0]
        # Structs of the hot path, built once (shared/FACTS.md: 2.9-4.0 us per dispatch this
        # way against 32-39 us through the binding's wrappers).
        self._begin_info = new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
            "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT})
        self._submit = new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": self._cmd})
        self._full = new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": _ALL_ACCESS})
        # Device writes are made visible to the host only by a barrier to the HOST stage: a
        # fence wait alone does not (Vulkan spec 7.3, "Fences", on vkWaitForFences).
        self._to_host = new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            "dstAccessMask": vk.VK_ACCESS_HOST_READ_BIT})
        self._copy = new("VkBufferCopy*")

    # -- recording -------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self._recording:
            check(lib.vkBeginCommandBuffer(self.cmd, self._begin_info), "vkBeginCommandBuffer")
            self._recording = True

    def record(self, records: Iterable[Dispatch | Copy]) -> None:
        """Record `records` in order, each behind a pipeline barrier when the tracker proves
        a dependency on pending work. Nothing is submitted.

        Raises: ShaderInterfaceError when a view breaks a device limit (`Pipeline.bind`)."""
        t0 = time.perf_counter_ns()
        self._begin()
        cmd, counters, tracker = self.cmd, self.counters, self.tracker
        compute = vk.VK_PIPELINE_BIND_POINT_COMPUTE
        for r in records:
            if r.transfer:
                self._copy.srcOffset, self._copy.dstOffset = r.src.offset, r.dst.offset
                self._copy.size = r.src.nbytes
            else:
                bound = r.pipeline.bind(r.tensors, counters)
            barrier, cause = tracker.before(r)
            if barrier:
                lib.vkCmdPipelineBarrier(cmd, _WORK_STAGES, _WORK_STAGES, 0, 1, self._full,
                                         0, NULL, 0, NULL)
                counters.barriers += 1
                if cause is not None:
                    name = "barriers_" + cause.lower()
                    setattr(counters, name, getattr(counters, name) + 1)
            if barrier or self._new_batch:
                counters.stages += 1
                self._new_batch = False
            if r.transfer:
                lib.vkCmdCopyBuffer(cmd, r.src.buffer.handle, r.dst.buffer.handle, 1, self._copy)
                counters.copies += 1
                continue
            p = r.pipeline
            lib.vkCmdBindPipeline(cmd, compute, p.handle)
            lib.vkCmdBindDescriptorSets(cmd, compute, p.layout, 0, 1, bound, 0, NULL)
            if r.push:
                # A cffi view made once per record: cffi converting the bytes object at every
                # call cost ~65 us per dispatch on lavapipe's host, against ~2 us this way.
                if r.push_c is None:
                    r.push_c = ffi.from_buffer(r.push)
                lib.vkCmdPushConstants(cmd, p.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                       len(r.push), r.push_c)
            lib.vkCmdDispatch(cmd, *r.grid)
            counters.dispatches += 1
        self.profiler.add("record", t0)

    def barrier(self) -> None:
        """Record a full pipeline barrier: everything recorded or submitted before it is
        ordered before everything after, and nothing is pending any more (counted in
        `counters.barriers`, under no cause)."""
        self._begin()
        lib.vkCmdPipelineBarrier(self.cmd, _WORK_STAGES, _WORK_STAGES, 0, 1, self._full,
                                 0, NULL, 0, NULL)
        self.counters.barriers += 1
        self.tracker.clear()

    # -- submission ------------------------------------------------------------------------
    def finish(self) -> None:
        """Submit what was recorded and wait until the GPU has executed it (drains)."""
        if not self._recording:
            return
        t = time.perf_counter_ns()
        lib.vkCmdPipelineBarrier(self.cmd, _WORK_STAGES, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                                 self._to_host, 0, NULL, 0, NULL)
        check(lib.vkEndCommandBuffer(self.cmd), "vkEndCommandBuffer")
        self._recording = False
        check(lib.vkQueueSubmit(self.device.queue, 1, self._submit, self.fence), "vkQueueSubmit")
        self.counters.submits += 1
        t = self.profiler.add("submit", t)
        timeout_s = config.FENCE_TIMEOUT_S.value
        result = lib.vkWaitForFences(self.device.handle, 1, self._fence, vk.VK_TRUE,
                                     timeout_ns(timeout_s))
        if result == vk.VK_TIMEOUT:
            raise VkrtError(f"GPU work did not finish within {timeout_s:g} s "
                            f"(VKRT_FENCE_TIMEOUT_S) on {self.device.name}")
        check(result, "vkWaitForFences")
        self.counters.fence_waits += 1
        self.profiler.add("wait", t)
        check(lib.vkResetFences(self.device.handle, 1, self._fence), "vkResetFences")
        check(lib.vkResetCommandBuffer(self.cmd, 0), "vkResetCommandBuffer")
        # The tracker keeps its pending accesses (see barriers.py): only a barrier clears them.
        self._new_batch = True
        self.device.check_validation()

    # -- host access -----------------------------------------------------------------------
    def _staging_for(self, direction: str, nbytes: int) -> Buffer:
        """The host-visible staging buffer for `direction` ("up" or "down"), grown to `nbytes`.
        Two buffers, so that growing the readback buffer can never free the upload buffer that
        a recorded, not yet submitted copy still reads."""
        staging = self._staging.get(direction)
        if staging is None or staging.nbytes < nbytes:
            if staging is not None:
                # No command names it: reads finish right after recording their copy, and
                # writes finish before they touch the upload buffer.
                staging.close(drain=False)
            nbytes = max(nbytes, STAGING_MIN_BYTES)
            staging = Buffer(self.device, nbytes, host_visible=True, name=f"staging-{direction}")
            self._staging[direction] = staging
        return staging

    def read(self, t: Tensor) -> np.ndarray:
        """Submit what is recorded, wait for it (drains), and return a copy of `t`'s elements
        as a numpy array of its dtype and shape. A buffer the host cannot map is copied
        through the staging buffer in the same submission: one submit and one fence wait per
        read either way."""
        if t.buffer.mapped is None:
            staging = self._staging_for("down", t.nbytes)
            self.record([Copy(t, Tensor(staging, 0, t.nbytes, t.dtype, t.shape), "readback")])
            self.finish()
            out = staging.host_view()[:t.nbytes].copy()
        else:
            self.finish()
            out = np.frombuffer(t.buffer.mapped, np.uint8, t.nbytes, t.offset).copy()
        self.counters.host_reads += 1
        self.counters.read_bytes += t.nbytes
        return out.view(t.dtype).reshape(t.shape)

    def write(self, t: Tensor, array: np.ndarray) -> None:
        """Copy `array`'s bytes into the start of `t`, ordered after everything recorded so
        far and before everything recorded after. Drains the queue first (the host must not
        overwrite memory the GPU may still read); a buffer the host cannot map gets a staging
        copy recorded into the next submission, through the tracker like any record.

        Raises: VkrtError when the bytes do not fit in `t`."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if data.nbytes > t.nbytes or data.nbytes == 0:
            raise VkrtError(f"writing {data.nbytes} bytes into {t!r}: does not fit "
                            f"(1 to {t.nbytes} bytes)")
        self.finish()
        start = time.perf_counter_ns()
        if t.buffer.mapped is not None:
            t.buffer.host_view()[t.offset:t.offset + data.nbytes] = data
        else:
            staging = self._staging_for("up", data.nbytes)
            staging.host_view()[:data.nbytes] = data
            self.record([Copy(Tensor(staging, 0, data.nbytes, "uint8", (data.nbytes,)),
                              Tensor(t.buffer, t.offset, data.nbytes, "uint8", (data.nbytes,),
                                     t.name), "upload")])
        self.counters.host_writes += 1
        self.counters.write_bytes += data.nbytes
        self.profiler.add("transfer", start)

    def upload(self, array: np.ndarray, name: str = "") -> Tensor:
        """A new device buffer holding `array`'s bytes, as a tensor of its dtype and shape."""
        buffer = Buffer(self.device, max(array.nbytes, 4), name=name)
        t = Tensor(buffer, 0, array.nbytes, array.dtype.name, array.shape, name)
        self.write(t, array)
        return t

    def close(self) -> None:
        """Discard anything recorded but not submitted, wait for the queue, and destroy the
        stream's command pool, fence and staging buffers."""
        h = self.device.handle
        self._recording = False
        if self.pool is not None:
            lib.vkQueueWaitIdle(self.device.queue)
        for staging in self._staging.values():
            staging.close(drain=False)
        self._staging = {}
        if self.pool is not None:
            lib.vkDestroyCommandPool(h, self.pool, NULL)
            self.pool = None
        if self.fence is not None:
            lib.vkDestroyFence(h, self.fence, NULL)
            self.fence = None
        self.device.release(self)
