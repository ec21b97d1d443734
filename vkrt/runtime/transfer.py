"""Host reads and writes of device tensors (`HostTransfers`, one per `Stream`), and the
`Readback` a read returns.

Memory the host can map is read and written in place, after a wait for exactly the
submissions that touched those bytes (the submitter's per-range last-use values, queue.py);
other memory goes through the recording slot's staging buffer and a copy recorded in the
current batch, ordered by the barrier tracker like any record (Stream.record). What waits for
what: queue.py's module docstring.
"""
from __future__ import annotations

import time

import numpy as np

from vkrt.errors import VkrtError
from vkrt.runtime.dispatch import Copy
from vkrt.runtime.memory import Buffer
from vkrt.runtime.tensor import Tensor


class Readback:
    """A host read requested now and collected later (`HostTransfers.read_later`, or a
    replay's readback): `get()` waits, on the stream's submitter (queue.py), for
    the submission it needs and returns a copy of the tensor's elements (numpy, its dtype and
    shape). Memory the host cannot map is copied into the slot's staging by a copy recorded in
    the current batch; mapped memory is read in place and must not have been written by a
    later submission in between (refused with VkrtError naming both values)."""

    __slots__ = ("queue", "tensor", "value", "slot", "offset", "data")

    def __init__(self, queue, tensor, value: int, slot=None, offset: int = 0):
        self.queue, self.tensor, self.value = queue, tensor, value
        self.slot, self.offset, self.data = slot, offset, None

    def collect(self) -> None:
        """Copy the bytes out of the slot's staging (its value has signalled)."""
        if self.data is None:
            t = self.tensor
            self.data = self.slot.staging.host_view()[self.offset:self.offset + t.nbytes].copy()

    def get(self) -> np.ndarray:
        s, t = self.queue, self.tensor
        if self.data is None:
            s.wait(self.value)
            start = time.perf_counter_ns()
            if self.slot is not None:
                self.collect()
            else:
                last = s.last_write(t.range)
                if last != self.value:
                    raise VkrtError(f"reading {t!r}: submission {last} wrote it after "
                                    f"submission {self.value}, whose result was asked for")
                self.data = np.frombuffer(t.buffer.mapped, np.uint8, t.nbytes, t.offset).copy()
            s.profiler.add("transfer", start)
            s.counters.host_reads += 1
            s.counters.read_bytes += t.nbytes
        return self.data.view(t.dtype).reshape(t.shape)


class HostTransfers:
    """The host side of one stream's data: `read_later` / `read` (device to host), `write` /
    `upload` (host to device). Waits and staging are the stream's submitter's (`queue`,
    queue.py); copies through staging are recorded by `record` (the stream's, so the tracker
    orders them)."""

    def __init__(self, device, queue, record):
        self.device, self.queue, self.record = device, queue, record

    def read_later(self, t: Tensor) -> Readback:
        """Ask for `t`'s elements as they are once everything recorded so far has run; the
        returned `Readback.get()` waits for the submission that last wrote `t` (not for later
        ones). A buffer the host cannot map gets a staging copy recorded now, in the current
        batch."""
        q = self.queue
        if t.buffer.mapped is None:
            staging, offset = q.stage(t.nbytes)
            self.record([Copy(t, Tensor(staging, offset, t.nbytes, t.dtype, t.shape), "readback")])
            rb = Readback(q, t, q.pending, q.slot, offset)
            q.slot.readbacks.append(rb)
            return rb
        return Readback(q, t, q.last_write(t.range))

    def read(self, t: Tensor) -> np.ndarray:
        """A copy of `t`'s elements (numpy, its dtype and shape) after everything recorded so
        far: waits for the submission that last wrote `t` (submitting the current batch when
        that is the one); a buffer the host cannot map is copied through staging in the current
        batch, which is submitted and waited for."""
        return self.read_later(t).get()

    def write(self, t: Tensor, array: np.ndarray) -> None:
        """Copy `array`'s bytes into the start of `t`, ordered after everything recorded so
        far and before everything recorded after. Mapped memory: waits for the last
        submission that read or wrote those bytes, then copies. Otherwise the bytes go into
        the slot's staging and a copy is recorded into the current batch, ordered by the
        tracker like any record (no host wait).

        Raises: VkrtError when the bytes do not fit in `t`."""
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        if data.nbytes > t.nbytes or data.nbytes == 0:
            raise VkrtError(f"writing {data.nbytes} bytes into {t!r}: does not fit "
                            f"(1 to {t.nbytes} bytes)")
        q = self.queue
        rng = (t.buffer.serial, t.offset, t.offset + data.nbytes)
        if t.buffer.mapped is not None:
            q.wait(q.last_use(rng))
            start = time.perf_counter_ns()
            t.buffer.host_view()[t.offset:t.offset + data.nbytes] = data
        else:
            start = time.perf_counter_ns()
            staging, offset = q.stage(data.nbytes)
            staging.host_view()[offset:offset + data.nbytes] = data
            self.record([Copy(Tensor(staging, offset, data.nbytes, "uint8", (data.nbytes,)),
                              Tensor(t.buffer, t.offset, data.nbytes, "uint8", (data.nbytes,),
                                     t.name), "upload")])
        q.counters.host_writes += 1
        q.counters.write_bytes += data.nbytes
        q.profiler.add("transfer", start)

    def upload(self, array: np.ndarray, name: str = "") -> Tensor:
        """A new device buffer holding `array`'s bytes, as a tensor of its dtype and shape."""
        buffer = Buffer(self.device, max(array.nbytes, 4), name=name)
        t = Tensor(buffer, 0, array.nbytes, array.dtype.name, array.shape, name)
        self.write(t, array)
        return t
