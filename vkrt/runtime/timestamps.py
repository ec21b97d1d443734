"""Timestamp queries of one stream's batches (`Timestamps`; Vulkan spec 17.5 "Timestamp
Queries"): with them on, each slot's batch writes a timestamp at its start (`begin`, called
by the submitter as the batch begins) and one after every record (Stream._encode, which
appends the record's name to `slot.timed`), so record i ran between timestamps i and i + 1;
once the batch's value has signalled the submitter calls `collect`, which turns them into
per-record GPU times on the host clock (VK_EXT_calibrated_timestamps where the device has it,
else aligned to the submission: `calibration_name`) in the stream's profiler.
"""
from __future__ import annotations

import numpy as np

from vkrt.runtime.queue import QUERIES_PER_SLOT
from vkrt.runtime.vk import lib, vk


class Timestamps:
    """The timestamp queries of one stream. `on`: time the batches that begin from now on
    (`enable` sets it where the queue has timestamps)."""

    def __init__(self, device, counters, profiler):
        self.device, self.counters, self.profiler = device, counters, profiler
        self.on = False
        self._last_gpu_end_ns = 0.0

    def enable(self) -> bool:
        """Time every record from the next batch on; False (and nothing changes) when the
        queue family has no timestamps (timestampValidBits 0)."""
        if not self.device.timestamp_valid_bits:
            return False
        self.on = True
        return True

    def begin(self, slot) -> None:
        """A batch begins in `slot`: reset its query pool and write the first timestamp
        (when on); mark the slot timed or not."""
        if not self.on:
            slot.timing = False
            return
        cmd = slot.cmd
        slot.enable_queries()
        lib.vkCmdResetQueryPool(cmd, slot.query_pool, 0, QUERIES_PER_SLOT)
        lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, slot.query_pool, 0)
        slot.timed, slot.timing = [], True

    def calibration_name(self) -> str:
        """How GPU times map onto the host clock (trace.py's metadata)."""
        return ("VK_EXT_calibrated_timestamps" if self.device.calibrated_timestamps
                else "submit-aligned")

    def collect(self, slot) -> None:
        """Turn the finished batch's timestamps into per-record GPU times (host clock)."""
        slot.timing = False
        n = len(slot.timed)
        if n == 0:
            return
        ticks = slot.query_results(n + 1)
        bits = self.device.timestamp_valid_bits
        if bits < 64:
            ticks &= np.uint64((1 << bits) - 1)
        period = self.device.timestamp_period_ns
        rel = (ticks - ticks[0]).astype(np.float64) * period   # ns since the batch started
        start_gpu_ns = float(ticks[0]) * period
        cal = self.device.calibrate() if self.device.calibrated_timestamps else None
        if cal is not None:
            gpu_ticks, host_ns = cal
            t0 = host_ns - (float(gpu_ticks) * period - start_gpu_ns)
        else:
            # Submit-aligned: a batch starts when it was submitted or when the previous one
            # ended on the host timeline, whichever is later (queue order).
            t0 = max(slot.submit_ns, self._last_gpu_end_ns)
        self._last_gpu_end_ns = t0 + rel[-1]
        self.profiler.add_gpu(slot.timed, t0, rel)
        self.counters.timestamps += n
