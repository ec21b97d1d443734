"""`Stream`: where dispatches are recorded, where the barrier policy is consulted, where batches
are submitted and where the host waits.

One command buffer, one fence (the first slice): dispatches are recorded until a host access
(`read`, `write`) or `finish()` ends the batch, submits it and waits on the fence. Each dispatch
declares its read and write sets (derived from the pipeline's reflected `writable_mask`) and
the barrier policy (`vkrt.runtime.barriers`) decides whether a barrier precedes it.
"""
from __future__ import annotations

import time

import numpy as np

from vkrt import config
from vkrt.errors import VkrtError
from vkrt.runtime.barriers import FullBarrier
from vkrt.runtime.device import Device
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import Pipeline
from vkrt.runtime.profiler import Counters, Profiler
from vkrt.runtime.vk import NULL, check, ffi, lib, new, vk

STAGING_MIN_BYTES = 1 << 20
_ALL_ACCESS = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
               | vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
_WORK_STAGES = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT


class Stream:
    """Records dispatches on `device`'s compute queue.

    Args:
        barriers: the barrier policy (default `FullBarrier`).
    Attributes: `counters` (Counters), `profiler` (Profiler).
    """

    def __init__(self, device: Device, barriers=None):
        self.device = device
        self.barriers = barriers or FullBarrier()
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

    def _barrier(self) -> None:
        lib.vkCmdPipelineBarrier(self.cmd, _WORK_STAGES, _WORK_STAGES, 0, 1, self._full,
                                 0, NULL, 0, NULL)

    def dispatch(self, pipeline: Pipeline, buffers, groups: tuple[int, int, int],
                 push: bytes | np.ndarray | None = None) -> None:
        """Record `pipeline` over `groups` workgroups (x, y, z) with `buffers` bound to its
        bindings in order and `push` as its push-constant bytes.

        Raises: ShaderInterfaceError when the buffers or push bytes differ from what the
        shader declares (module name, declared vs given).
        """
        t0 = time.perf_counter_ns()
        push_nbytes = 0 if push is None else len(push) if isinstance(push, bytes) else push.nbytes
        pipeline.check_bindings(buffers, push_nbytes)
        bound = pipeline.bind(buffers, self.counters)
        self._begin()
        if self.barriers.before_dispatch(bound.reads, bound.writes):
            self._barrier()
            self.counters.barriers += 1
        cmd = self.cmd
        lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
        lib.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                    0, 1, bound.set, 0, NULL)
        if push_nbytes:
            lib.vkCmdPushConstants(cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                   push_nbytes, ffi.from_buffer(push))
        lib.vkCmdDispatch(cmd, *groups)
        self.counters.dispatches += 1
        self.profiler.add("record", t0)

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
                                     int(timeout_s * 1e9))
        if result == vk.VK_TIMEOUT:
            raise VkrtError(f"GPU work did not finish within {timeout_s:g} s "
                            f"(VKRT_FENCE_TIMEOUT_S) on {self.device.name}")
        check(result, "vkWaitForFences")
        self.counters.fence_waits += 1
        self.profiler.add("wait", t)
        check(lib.vkResetFences(self.device.handle, 1, self._fence), "vkResetFences")
        check(lib.vkResetCommandBuffer(self.cmd, 0), "vkResetCommandBuffer")
        self.barriers.reset()
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

    def _record_copy(self, src: Buffer, dst: Buffer, src_offset: int, dst_offset: int,
                     nbytes: int) -> None:
        """Record a copy behind a full barrier (transfer stages are in the barrier's scope,
        so the dispatch barrier that follows also orders the copy before later readers)."""
        self._begin()
        self._barrier()  # not counted: counters.barriers counts barriers before dispatches
        self._copy.srcOffset, self._copy.dstOffset, self._copy.size = src_offset, dst_offset, nbytes
        lib.vkCmdCopyBuffer(self.cmd, src.handle, dst.handle, 1, self._copy)

    def read(self, buffer: Buffer, dtype=np.float32, count: int | None = None,
             offset: int = 0) -> np.ndarray:
        """Submit what is recorded, wait for it (drains), and return a copy of `count` elements
        of `dtype` at byte `offset` of `buffer` (default: to the end), as a 1-D numpy array.
        A buffer the host cannot map is copied through the staging buffer in the same
        submission: one submit and one fence wait per read either way."""
        dtype = np.dtype(dtype)
        nbytes = buffer.nbytes - offset if count is None else count * dtype.itemsize
        if buffer.mapped is None:
            staging = self._staging_for("down", nbytes)
            self._record_copy(buffer, staging, offset, 0, nbytes)
            self.finish()
            out = staging.host_view()[:nbytes].copy()
        else:
            self.finish()
            out = np.frombuffer(buffer.mapped, dtype=np.uint8, count=nbytes, offset=offset).copy()
        self.counters.host_reads += 1
        self.counters.read_bytes += nbytes
        return out.view(dtype)

    def write(self, buffer: Buffer, array: np.ndarray, offset: int = 0) -> None:
        """Copy `array`'s bytes into `buffer` at byte `offset`, ordered after everything
        recorded so far and before everything recorded after. Drains the queue first (the
        host must not overwrite memory the GPU may still read); a buffer the host cannot map
        gets a staging copy recorded into the next submission.

        Raises: ValueError when the bytes do not fit."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if offset + data.nbytes > buffer.nbytes:
            raise ValueError(f"writing {data.nbytes} bytes at offset {offset} into "
                             f"{buffer!r}: past its end")
        self.finish()
        t = time.perf_counter_ns()
        if buffer.mapped is not None:
            buffer.host_view()[offset:offset + data.nbytes] = data
        else:
            staging = self._staging_for("up", data.nbytes)
            staging.host_view()[:data.nbytes] = data
            self._record_copy(staging, buffer, 0, offset, data.nbytes)
        self.counters.host_writes += 1
        self.counters.write_bytes += data.nbytes
        self.profiler.add("transfer", t)

    def upload(self, array: np.ndarray, name: str = "") -> Buffer:
        """A new device buffer holding `array`'s bytes."""
        buffer = Buffer(self.device, max(array.nbytes, 4), name=name)
        self.write(buffer, array)
        return buffer

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
