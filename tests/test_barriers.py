"""The barrier tracker (vkrt/runtime/barriers.py) on dispatch lists, first without a device
(exact barrier positions and causes), then the same lists recorded on lavapipe: the stream
records exactly the planned barriers, the result equals numpy's execution of the list, and
with `VKRT_VALIDATION=1` synchronization validation reports nothing.

Two kernels make every sequence, chosen for their access patterns:
- `add(x, y)`: x += y (x read and written, y read);
- `copy(src, dst)`: dst = src (copy_rows: src read, dst written, never read).
Views are element ranges of named buffers; `v("a", 64, 128)` is floats 64..127 of buffer a.
Offsets are multiples of 64 floats (256 bytes, the largest minStorageBufferOffsetAlignment
the Vulkan spec allows), so every view binds on any device.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vkrt.kernels import Kernels
from vkrt.runtime.barriers import Tracker, plan, stages
from vkrt.runtime.dispatch import Copy, Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.queue import BARRIER, DISPATCH
from vkrt.runtime.stream import Stream
from vkrt.runtime.tensor import Tensor

BUFFER_FLOATS = 256
BUFFERS = "abcdxyz"

# Each sequence: a list of batches (submissions), each a list of ("add"|"copy", view, view),
# and the expected decision before each record (None: no barrier).
SEQUENCES = {
    "chain": ([[("add", ("x", 0, 64), ("y", 0, 64))] * 3], [[None, "RAW", "RAW"]]),
    "independent": ([[("add", ("a", 0, 64), ("y", 0, 64)), ("add", ("b", 0, 64), ("y", 0, 64)),
                      ("add", ("c", 0, 64), ("y", 0, 64))]], [[None, None, None]]),
    "write_after_read": ([[("copy", ("x", 0, 64), ("z", 0, 64)),
                           ("add", ("x", 0, 64), ("y", 0, 64))]], [[None, "WAR"]]),
    "write_after_write": ([[("copy", ("a", 0, 64), ("x", 0, 64)),
                            ("copy", ("b", 0, 64), ("x", 0, 64))]], [[None, "WAW"]]),
    "overlap_by_one_element": ([[("copy", ("a", 0, 65), ("x", 0, 65)),
                                 ("copy", ("b", 64, 128), ("x", 64, 128))]], [[None, "WAW"]]),
    "touching_views": ([[("copy", ("a", 0, 64), ("x", 0, 64)),
                         ("copy", ("b", 64, 128), ("x", 64, 128))]], [[None, None]]),
    "read_after_write_of_overlap": ([[("copy", ("a", 0, 65), ("x", 0, 65)),
                                      ("copy", ("x", 64, 128), ("z", 0, 64))]], [[None, "RAW"]]),
    "reads_of_overlapping_views": ([[("add", ("a", 0, 128), ("x", 0, 128)),
                                     ("add", ("b", 0, 64), ("x", 64, 128))]], [[None, None]]),
    "across_a_submission": ([[("add", ("x", 0, 64), ("y", 0, 64))],
                             [("add", ("z", 0, 64), ("x", 0, 64))]], [[None], ["RAW"]]),
    "war_across_a_submission": ([[("copy", ("x", 0, 64), ("z", 0, 64))],
                                 [("copy", ("a", 0, 64), ("x", 0, 64))]], [[None], ["WAR"]]),
}


# -- without a device ----------------------------------------------------------------------
FAKE_ADD = SimpleNamespace(name="add", readable=(True, True), writable=(True, False))
FAKE_COPY = SimpleNamespace(name="copy_rows", readable=(True, False), writable=(False, True))


def fake_records(batches) -> list[list]:
    buffers = {n: SimpleNamespace(serial=i, nbytes=4 * BUFFER_FLOATS, name=n)
               for i, n in enumerate(BUFFERS)}

    def view(spec):
        name, start, stop = spec
        return Tensor(buffers[name], 4 * start, 4 * (stop - start), "float32", (stop - start,))

    return [[Dispatch(FAKE_ADD if kind == "add" else FAKE_COPY, (view(a), view(b)), (1, 1, 1),
                      b"", kind) for kind, a, b in batch] for batch in batches]


@pytest.mark.parametrize("name", SEQUENCES)
def test_plan_without_a_device(name):
    batches, expected = SEQUENCES[name]
    tracker = Tracker()  # one tracker for every batch: pending accesses survive a submission
    assert [plan(batch, tracker) for batch in fake_records(batches)] == expected


@pytest.mark.parametrize("name", SEQUENCES)
def test_always_puts_a_barrier_before_every_record_and_still_names_causes(name):
    batches, expected = SEQUENCES[name]
    tracker = Tracker(always=True)
    got = [plan(batch, tracker) for batch in fake_records(batches)]
    assert got == [[d or "always" for d in batch] for batch in expected]


def test_a_barrier_clears_what_was_pending():
    # The first add reads y; the RAW barrier before the second add orders it, so a later
    # write of y is not a WAR hazard any more.
    seq = [("add", ("x", 0, 64), ("y", 0, 64)), ("add", ("z", 0, 64), ("x", 0, 64)),
           ("copy", ("a", 0, 64), ("y", 0, 64))]
    [records] = fake_records([seq])
    assert plan(records) == [None, "RAW", None]
    tracker = Tracker()
    plan(records[:2], tracker)
    assert tracker.pending() == 3  # z read and written, x read: only what followed the barrier


def test_copies_are_transfer_dependencies():
    [[add]] = fake_records([[("add", ("x", 0, 64), ("y", 0, 64))]])
    x, y = add.tensors
    upload = Copy(Tensor(x.buffer, 1024 - 256, 256, "float32", (64,)), y, "upload")
    # The add reads y, which the copy wrote; the readback copy reads x, which the add wrote.
    readback = Copy(x, Tensor(add.tensors[1].buffer, 512, 256, "float32", (64,)), "readback")
    assert plan([upload, add, readback]) == [None, "transfer", "transfer"]


def test_stages_count_barrier_separated_groups():
    assert stages([]) == 0
    assert stages([None, None, "RAW", None, "WAR"]) == 3
    assert stages(["RAW", None, "RAW"]) == 2


# -- on the device -------------------------------------------------------------------------
def initial(name: str) -> np.ndarray:
    return (100 * BUFFERS.index(name) + np.arange(BUFFER_FLOATS)).astype(np.float32)


def numpy_run(batches) -> dict[str, np.ndarray]:
    """The oracle: each record applied in order to host arrays."""
    mem = {n: initial(n) for n in BUFFERS}
    for batch in batches:
        for kind, (an, a0, a1), (bn, b0, b1) in batch:
            if kind == "add":
                mem[an][a0:a1] += mem[bn][b0:b1]
            else:
                mem[bn][b0:b1] = mem[an][a0:a1]
    return mem


@pytest.fixture(scope="module")
def device(checked_device):
    return checked_device


@pytest.mark.parametrize("mode", ["tracked", "always"])
@pytest.mark.parametrize("name", SEQUENCES)
def test_sequence_on_the_device_matches_plan_and_numpy(device, name, mode):
    batches, expected = SEQUENCES[name]
    stream = Stream(device, barriers=mode)
    k = Kernels(PipelineCache(device))
    buffers = {n: Buffer(device, 4 * BUFFER_FLOATS, name=n) for n in BUFFERS}
    try:
        for n, b in buffers.items():
            stream.write(Tensor.of(b, "float32"), initial(n))
        stream.barrier()  # start from nothing pending, as the plan does

        def view(spec):
            n, start, stop = spec
            return Tensor(buffers[n], 4 * start, 4 * (stop - start), "float32", (stop - start,))

        before = stream.counters.snapshot()
        for i, batch in enumerate(batches):
            records = [k.add(view(a), view(b), b[2] - b[1]) if kind == "add"
                       else k.copy_rows(view(a), view(b), 1, 0)
                       for kind, a, b in batch]
            stream.record(records)
            # The command buffer holds each planned barrier right before its dispatch (the
            # first batch also holds the uploads and the barrier above, before these).
            logged = [c for d in expected[i] for c in (
                [BARRIER] if d or mode == "always" else []) + [DISPATCH]]
            assert stream.commands[-len(logged):] == logged
            if i + 1 < len(batches):
                stream.submit()   # not waited for: the next batch may start while it runs
        stream.synchronize()  # validation messages raise here
        got = stream.counters.since(before)
        want = [d for batch in expected for d in batch]
        assert got["barriers"] == (len(want) if mode == "always" else sum(map(bool, want)))
        for cause in ("RAW", "WAW", "WAR"):
            assert got["barriers_" + cause.lower()] == want.count(cause), cause
        oracle = numpy_run(batches)
        for n, b in buffers.items():
            np.testing.assert_array_equal(stream.read(Tensor.of(b, "float32")), oracle[n], n)
    finally:
        for b in buffers.values():
            b.close()
        stream.close()
