"""`Recording`: a list of records recorded once into its own command buffer and submitted again
and again (`Stream.capture`, `Stream.replay`): a replayed decode step costs the host one
vkQueueSubmit instead of recording ~500 dispatches.

What may change between replays lives in device memory, never in the recorded commands: the
decode step reads its position from a [1] u32 buffer that its last dispatch advances
(`Kernels.advance_pos`), and the token ring gives each in-flight step its own recording
(ring phase j reads token slot j - 1 and writes slot j). A recording names buffers by their
handles and descriptor sets: it must be captured again when any buffer it binds is
reallocated (`key`, compared by the model; `vkrt/models/llama.py`).

Ordering. A recording begins with a full pipeline barrier, so it runs after everything submitted
before it (Vulkan spec 7.6 "Pipeline Barriers": a barrier orders against all earlier commands
in submission order), and inside it the barrier tracker decided each barrier at capture as it
does for `Stream.record`. The stream records a full barrier before the first record that
follows a replay (`Stream.record`). Both barriers are in the command logs (stream.py):
`Recording.commands` begins with "barrier", and so does the log of the batch recorded after
a replay (`Stream.commands`), whatever the tracker decides for its first record. The host's
waits see a replay like any submission: its byte ranges are marked read/written by the
replay's timeline value (queue.py). A recording is not submitted again while pending (spec
6.4: without SIMULTANEOUS_USE), and a host read of its readback copy happens before its next
submission overwrites the bytes.
"""
from __future__ import annotations

from vkrt.runtime.vk import NULL, check, lib, new, vk


class Recording:
    """One captured list of records. Attributes: `cmd`/`cmds` (its command buffer), `key` (what
    the capturer keyed it on), `writes` (byte ranges, deduplicated), `reads` (one range per
    buffer: the hull of the bytes read), `dispatches`, `barriers`, `stages` (counted at
    capture), `value` (its last submission, 0 if never), `staging` (host-visible Buffer for
    its readback copy, or None), `readbacks` (Readbacks of its staging not yet collected),
    `commands` (its command log, filled at capture: what its command buffer holds in order,
    one entry per pipeline barrier, dispatch and copy, "barrier" / "dispatch" / "copy", and
    "host_barrier" last; binds, push constants and timestamps are not logged; stream.py).
    A capture's log begins with "barrier": the full barrier that orders it after everything
    submitted before it. `buffers`: every Buffer its commands name; `Stream.replay` refuses
    the recording once any of them is closed (a stale key would otherwise replay commands on
    freed memory)."""

    def __init__(self, device, key=None):
        self.device, self.key = device, key
        self.pool = None
        self.value = 0
        self.writes: list[tuple] = []
        self.reads: list[tuple] = []
        self.buffers: list = []
        self.dispatches = self.barriers = self.stages = 0
        self.staging = None
        self.readbacks: list = []
        self.commands: list[str] = []
        self.last_name = ""   # its last record's name (errors name it)
        info = new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "queueFamilyIndex": device.queue_family})
        out = new("VkCommandPool*")
        check(lib.vkCreateCommandPool(device.handle, info, NULL, out), "vkCreateCommandPool")
        self.pool = out[0]
        alloc = new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, "commandPool": self.pool,
            "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, "commandBufferCount": 1})
        self.cmds = new("VkCommandBuffer[1]")
        check(lib.vkAllocateCommandBuffers(device.handle, alloc, self.cmds),
              "vkAllocateCommandBuffers")
        self.cmd = self.cmds[0]

    def close(self) -> None:
        """Destroy the command pool and staging. The caller has waited for `value`."""
        if self.staging is not None:
            self.staging.close(drain=False)
            self.staging = None
        if self.pool is not None and self.device.handle is not None:
            lib.vkDestroyCommandPool(self.device.handle, self.pool, NULL)
        self.pool = None
