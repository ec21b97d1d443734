"""Pipelined submission (vkrt/runtime/queue.py): slots, timeline values, what a host access
waits for, deferred frees, timestamps. On lavapipe, which runs submissions on its own thread.

`stream.hold()` makes every submission wait on a semaphore the host signals (`release()`):
the GPU provably has not started, so a host access that does not wait for its writer reads
stale bytes, a wait that should not happen blocks (and times out after VKRT_FENCE_TIMEOUT_S,
set short here), and a buffer freed too early is visibly gone. `release_after(s)` signals from
another thread once the test's host blocks on the submission.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from vkrt import config
from vkrt.errors import VkrtError
from vkrt.kernels import Kernels
from vkrt.runtime.device import Device
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.queue import BARRIER, DISPATCH, HOST_BARRIER
from vkrt.runtime.stream import Stream
from vkrt.runtime.tensor import Tensor
from vkrt.runtime.vk import ffi

N = 64


@pytest.fixture(scope="module")
def device(checked_device):
    return checked_device


@pytest.fixture
def kernels(device):
    return Kernels(PipelineCache(device))


@pytest.fixture(autouse=True)
def short_timeout():
    with config.FENCE_TIMEOUT_S.override("20"):
        yield


def make(stream, value, name=""):
    return stream.upload(np.full(N, value, np.float32), name=name)


def release_after(stream):
    """Release the held submissions from another thread once the host has blocked in a wait
    for them (in `vkWaitSemaphores`, whatever the machine's speed or load); returns the
    thread (join it)."""
    q, entered = stream.queue, threading.Event()
    real = q.wait_semaphores

    def wait(*args):
        entered.set()
        return real(*args)

    def release():
        entered.wait(15)      # (a host that never waits: the test's own asserts then fail)
        q.wait_semaphores = real
        stream.release()

    q.wait_semaphores = wait
    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_timeline_semaphore_feature_is_enabled(device):
    assert device.features["timelineSemaphore"]


@pytest.mark.parametrize("inflight", [1, 2, 3])
def test_slots_rotate_and_own_their_resources(device, kernels, inflight):
    stream = Stream(device, inflight=inflight)
    try:
        x, y = make(stream, 0), make(stream, 1)
        stream.synchronize()
        slots = stream.queue.slots
        assert len(slots) == inflight
        # Each slot its own command pool, command buffer and staging buffer.
        assert len({int(ffi.cast("uintptr_t", s.cmd)) for s in slots}) == inflight
        assert len({s.staging.serial for s in slots}) == inflight
        fresh = sum(s.value == 0 for s in slots)   # never submitted from (mapped uploads)
        stream.counters.max_inflight = 0
        before = stream.counters.snapshot()
        used, values = [], []
        for _ in range(2 * inflight):
            stream.record([kernels.add(x, y, N)])
            used.append(stream.queue.slot.index)
            values.append(stream.submit())
        stream.synchronize()
        d = stream.counters.since(before)
        first = used[0]
        assert used == [(first + i) % inflight for i in range(2 * inflight)]
        assert values == list(range(values[0], values[0] + 2 * inflight))
        assert d["submits"] == 2 * inflight
        assert d["slot_reuses"] == 2 * inflight - fresh   # a slot waited for before reuse
        assert d["max_inflight"] <= inflight
        if inflight == 1:
            assert d["max_inflight"] == 1
            # The plain path: every submit waited right away.
            assert d["waits_blocked"] + d["waits_ready"] >= 2 * inflight
        np.testing.assert_array_equal(stream.read(x), 2 * inflight)
    finally:
        stream.close()


@pytest.mark.parametrize("inflight", [2, 3])
def test_submit_does_not_wait_and_depth_reaches_inflight(device, kernels, inflight):
    stream = Stream(device, inflight=inflight)
    try:
        x, y = make(stream, 0), make(stream, 1)
        stream.synchronize()
        stream.counters.max_inflight = 0
        before = stream.counters.snapshot()
        stream.hold()   # nothing below can run until release: a wait would time out
        with config.FENCE_TIMEOUT_S.override("2"):
            for _ in range(inflight):
                stream.record([kernels.add(x, y, N)])
                stream.submit()
        d = stream.counters.since(before)
        assert d["submits"] == inflight
        assert d["max_inflight"] == inflight
        assert d["waits_blocked"] == 0
        # The next batch needs the first slot back: it blocks until the GPU ran it.
        timer = release_after(stream)
        stream.record([kernels.add(x, y, N)])
        timer.join()
        assert stream.counters.since(before)["waits_blocked"] == 1
        np.testing.assert_array_equal(stream.read(x), inflight + 1)
    finally:
        stream.close()


def test_host_read_waits_for_its_writer_only(device, kernels):
    stream = Stream(device, inflight=2)
    try:
        x, y, w = make(stream, 0, "x"), make(stream, 1, "y"), make(stream, 5, "w")
        stream.synchronize()
        before = stream.counters.snapshot()
        stream.hold()
        stream.record([kernels.add(x, y, N)])
        stream.submit()
        if w.buffer.mapped is not None:
            # w's last writer has completed: reading it does not wait for the held add.
            with config.FENCE_TIMEOUT_S.override("2"):
                np.testing.assert_array_equal(stream.read(w), 5)
            assert stream.counters.since(before)["waits_blocked"] == 0
        timer = release_after(stream)
        got = stream.read(x)     # blocks until the add has run
        timer.join()
        np.testing.assert_array_equal(got, 1)
        assert stream.counters.since(before)["waits_blocked"] == 1
    finally:
        stream.close()


def test_host_write_waits_for_the_last_reader(device, kernels):
    stream = Stream(device, inflight=2)
    try:
        x, z = make(stream, 3, "x"), make(stream, 0, "z")
        stream.synchronize()
        before = stream.counters.snapshot()
        stream.hold()
        stream.record([kernels.add(z, x, N)])    # reads x
        stream.submit()
        if x.buffer.mapped is not None:          # the host writes x only after the add ran
            timer = release_after(stream)
            stream.write(x, np.full(N, 100, np.float32))
            timer.join()
            assert stream.counters.since(before)["waits_blocked"] == 1
        else:   # no host wait: a copy the tracker orders after the add (its second barrier)
            stream.write(x, np.full(N, 100, np.float32))
            d = stream.counters.since(before)
            assert d["waits_blocked"] == 0 and d["barriers_transfer"] == 2
            stream.release()
        np.testing.assert_array_equal(stream.read(z), 3)
        np.testing.assert_array_equal(stream.read(x), 100)
    finally:
        stream.close()


def test_free_is_deferred_until_the_last_use(device, kernels):
    stream = Stream(device, inflight=2)
    try:
        x, y = make(stream, 0, "x"), make(stream, 2, "y")
        stream.synchronize()
        before = stream.counters.snapshot()
        stream.hold()
        stream.record([kernels.add(x, y, N)])
        value = stream.submit()
        y.buffer.close()               # the held add still reads it
        d = stream.counters.since(before)
        assert d["deferred_frees"] == 1 and d["deferred_freed"] == 0
        assert y.buffer.handle is not None and y.buffer.memory is not None
        assert stream.queue.completed < value
        stream.release()
        np.testing.assert_array_equal(stream.read(x), 2)   # its wait frees y
        d = stream.counters.since(before)
        assert d["deferred_freed"] == 1
        assert y.buffer.handle is None
        # A buffer no command names is freed at once.
        z = make(stream, 1, "z")
        stream.synchronize()
        z.buffer.close()
        assert z.buffer.handle is None
        assert stream.counters.since(before)["deferred_frees"] == 1
    finally:
        stream.close()


def test_a_buffer_two_streams_use_is_freed_after_both(device, kernels):
    """Device.retire: every stream's submitter is asked; the host waits for the uses of all
    but the last stream, and that one frees the buffer once its use completes. Both uses are
    held until the host lets them run, so neither has completed when the buffer is closed,
    however fast the device: a's is let go from another thread while close() waits for it."""
    a, b = Stream(device, inflight=2), Stream(device, inflight=2)
    try:
        x = make(a, 0, "x")
        xb, yb = make(b, 0, "xb"), make(b, 0, "yb")
        y = make(a, 2, "y")
        a.synchronize()
        b.synchronize()
        a.hold()
        a.record([kernels.add(x, y, N)])          # a reads y, held
        va = a.submit()
        b.hold()
        b.record([kernels.add(xb, y, N)])        # b reads y, held
        vb = b.submit()
        assert a.queue.completed < va
        let_go = threading.Timer(0.2, a.release)
        let_go.start()
        y.buffer.close()
        let_go.join()
        assert a.queue.waited >= va               # the first user's read was waited for
        assert a.queue.completed >= va
        assert y.buffer.handle is not None        # the held one's is pending: deferred
        assert b.queue.completed < vb
        b.release()
        np.testing.assert_array_equal(b.read(xb), 2)
        assert y.buffer.handle is None
        for t in (x, xb, yb):
            t.buffer.close()
    finally:
        b.close()
        a.close()


def test_each_slot_stages_its_own_uploads():
    """Staging path, two uploads in two held submissions: each slot's staging keeps its
    bytes until its copy ran."""
    with Device(direct_host_access=False) as dev:
        stream = Stream(dev, inflight=2)
        a = Tensor.of(Buffer(dev, 4 * N, name="a"), "float32")
        b = Tensor.of(Buffer(dev, 4 * N, name="b"), "float32")
        stream.synchronize()
        stream.hold()
        stream.write(a, np.full(N, 7, np.float32))
        stream.submit()
        stream.write(b, np.full(N, 9, np.float32))
        stream.submit()
        stream.release()
        np.testing.assert_array_equal(stream.read(a), 7)
        np.testing.assert_array_equal(stream.read(b), 9)
        assert len({s.staging.serial for s in stream.queue.slots}) == 2
        stream.close()


def test_readback_refuses_a_tensor_overwritten_by_a_later_submission(kernels, device):
    stream = Stream(device, inflight=2)
    try:
        x, y = make(stream, 0), make(stream, 1)
        stream.record([kernels.add(x, y, N)])
        rb = stream.read_later(x)
        stream.submit()
        stream.record([kernels.add(x, y, N)])
        stream.submit()
        if x.buffer.mapped is None:   # a staging copy is a snapshot: the first add's result
            np.testing.assert_array_equal(rb.get(), 1)
        else:
            with pytest.raises(VkrtError, match=r"submission \d+ wrote it after submission \d+"):
                rb.get()
        np.testing.assert_array_equal(stream.read(x), 2)
    finally:
        stream.close()


def test_inflight_below_one_is_refused(device):
    with pytest.raises(VkrtError, match="VKRT_INFLIGHT must be at least 1, got 0"):
        Stream(device, inflight=0)


def test_timestamps_time_each_dispatch_by_name(device, kernels):
    if not device.timestamp_valid_bits:
        pytest.skip("no timestamps on this queue")
    stream = Stream(device, inflight=2, timestamps=True)
    try:
        x, y = make(stream, 0), make(stream, 1)
        stream.synchronize()
        before = stream.counters.snapshot()
        stream.record([kernels.add(x, y, N, name="first"), kernels.add(x, y, N, name="second")])
        stream.submit()
        stream.record([kernels.add(x, y, N, name="first")])
        stream.synchronize()
        assert stream.counters.since(before)["timestamps"] == 3
        assert stream.profiler.gpu_count == {"first": 2, "second": 1} | {
            k: v for k, v in stream.profiler.gpu_count.items() if k not in ("first", "second")}
        assert stream.profiler.gpu_count["first"] == 2
        assert all(v >= 0 for v in stream.profiler.gpu_ns.values())
    finally:
        stream.close()


# -- command logs: the barriers around a replay (replay.py "Ordering") ---------------------
def test_a_recording_begins_with_a_full_barrier(device, kernels):
    """What the recording's command buffer holds, in order: the leading full barrier, then
    the tracker's (none before the first add, RAW before the second)."""
    stream = Stream(device, barriers="tracked", inflight=2)
    try:
        x, y = make(stream, 0, "x"), make(stream, 1, "y")
        stream.synchronize()
        before = stream.counters.snapshot()
        rec = stream.capture([kernels.add(x, y, N), kernels.add(x, y, N)])
        assert rec.commands == [BARRIER, DISPATCH, BARRIER, DISPATCH, HOST_BARRIER]
        d = stream.counters.since(before)
        assert rec.barriers == d["barriers"] == rec.commands.count(BARRIER) == 2
        assert d["barriers_raw"] == 1 and rec.dispatches == 2
        stream.replay(rec)
        stream.replay(rec)
        np.testing.assert_array_equal(stream.read(x), 4)
        assert rec.commands[0] == BARRIER      # replays record nothing
    finally:
        stream.close()


def test_a_recording_naming_a_closed_buffer_is_refused(device, kernels):
    """A recording holds handles and descriptor sets of the buffers it names: once one of
    them is closed (freed now or once its last submission is done) the recording is stale
    and replaying it is refused before anything is submitted, whatever its key says."""
    stream = Stream(device, inflight=2)
    try:
        x, y = make(stream, 0, "x"), make(stream, 1, "y")
        stream.synchronize()
        rec = stream.capture([kernels.add(x, y, N)])
        stream.replay(rec)
        submitted = stream.submitted
        y.buffer.close()
        with pytest.raises(VkrtError, match="names buffer 'y', closed since the capture"):
            stream.replay(rec)
        assert stream.submitted == submitted
        np.testing.assert_array_equal(stream.read(x), 1)
    finally:
        stream.close()


@pytest.mark.parametrize("replayed", [True, False], ids=["after-a-replay", "no-replay"])
def test_the_batch_after_a_replay_begins_with_a_full_barrier(device, kernels, replayed):
    """The replay writes x; the add after it reads x, but the stream's tracker never saw that
    write (and has nothing pending): only the barrier after a replay orders the two. Without
    a replay in between, the same add records no barrier."""
    stream = Stream(device, barriers="tracked", inflight=2)
    try:
        x, y, z = make(stream, 0, "x"), make(stream, 1, "y"), make(stream, 10, "z")
        stream.barrier()      # nothing pending: the tracker alone puts no barrier before z += x
        stream.synchronize()
        rec = stream.capture([kernels.add(x, y, N)])
        before = stream.counters.snapshot()
        if replayed:
            stream.replay(rec)
        stream.record([kernels.add(z, x, N)])
        log = stream.commands
        assert log == ([BARRIER, DISPATCH] if replayed else [DISPATCH])
        d = stream.counters.since(before)
        assert d["barriers"] == int(replayed)
        assert d["barriers_raw"] == d["barriers_war"] == d["barriers_waw"] == 0
        stream.submit()
        assert log[-1] == HOST_BARRIER and stream.commands is log
        # The next record of the same stream follows no new replay: no barrier of its own.
        stream.record([kernels.add(y, y, N)])
        assert stream.commands == [DISPATCH]
        np.testing.assert_array_equal(stream.read(z), 11 if replayed else 10)
    finally:
        stream.close()


@pytest.mark.parametrize("inflight", [1, 2])
def test_a_long_record_is_submitted_every_flush_every_records(device, kernels, inflight):
    """`record(records, flush_every=k)` submits after every k records but the last: a chain
    of 7 dependent adds with k = 3 is three batches, the first two submitted by record, and
    each batch after the first begins with the RAW barrier on the previous one's write."""
    stream = Stream(device, barriers="tracked", inflight=inflight)
    try:
        x, y = make(stream, 0, "x"), make(stream, 1, "y")
        stream.synchronize()
        before = stream.counters.snapshot()
        stream.record([kernels.add(x, y, N) for _ in range(7)], flush_every=3)
        assert stream.counters.since(before)["submits"] == 2
        assert stream.commands == [BARRIER, DISPATCH]     # the third batch: add 7, after its RAW
        stream.submit()
        d = stream.counters.since(before)
        assert d["submits"] == 3 and d["dispatches"] == 7
        assert d["barriers_raw"] == 6   # every add reads x, which the one before wrote
        np.testing.assert_array_equal(stream.read(x), 7)
    finally:
        stream.close()


def test_ctrl_c_interrupts_a_host_wait_while_the_gpu_is_held(device, kernels):
    """A KeyboardInterrupt reaches a host blocked on GPU work before that work ends, from
    Python as from the command line (Submitter._block waits in slices). The submission is
    held until the host signals it, so the GPU provably has not finished when SIGINT
    arrives, whatever the machine's speed: an unsliced wait sees the interrupt only after
    the fallback release below, and the test fails."""
    import signal
    import time

    stream = Stream(device, inflight=2)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    main, done, released = threading.get_ident(), threading.Event(), threading.Event()

    def interrupt_then_release():
        time.sleep(0.2)
        signal.pthread_kill(main, signal.SIGINT)
        if not done.wait(10):          # only when the wait ignored the interrupt
            released.set()
            stream.release()

    try:
        x, y = make(stream, 0, "x"), make(stream, 1, "y")
        stream.synchronize()
        stream.hold()
        stream.record([kernels.add(x, y, N)])
        stream.submit()
        helper = threading.Thread(target=interrupt_then_release)
        with config.FENCE_TIMEOUT_S.override("120"):
            helper.start()
            with pytest.raises(KeyboardInterrupt):
                stream.read(x)
        assert not released.is_set(), "the interrupt arrived only once the GPU was done"
        done.set()
        helper.join()
        stream.release()
        np.testing.assert_array_equal(stream.read(x), 1)   # the held work still ran, once
    finally:
        done.set()
        signal.signal(signal.SIGINT, old)
        stream.close()


def test_device_lost_names_the_work_and_refuses_further_use():
    """VK_ERROR_DEVICE_LOST from a host wait (a desktop driver's watchdog ending a long
    submission; here the driver's answer stands in for one, the work held so that the wait
    blocks) raises one line naming the submission and what it ran; every later use of the
    device, by this stream or another, raises at once instead of failing later at random;
    closing does not hang."""
    from vkrt.errors import DeviceLostError
    from vkrt.runtime.vk import vk

    with Device() as device:
        ks = Kernels(PipelineCache(device))
        stream = Stream(device, inflight=2)
        try:
            x, y = make(stream, 0, "x"), make(stream, 1, "y")
            stream.synchronize()
            stream.hold()
            stream.record([ks.add(x, y, N, name="blk.7.attn_output")])
            value = stream.submit()
            stream.queue.wait_semaphores = lambda *args: vk.VK_ERROR_DEVICE_LOST
            with pytest.raises(DeviceLostError) as e:
                stream.read(x)
            msg = str(e.value)
            assert "\n" not in msg and "VK_ERROR_DEVICE_LOST" in msg, msg
            # (A device the host cannot map records the read's copy in submission value + 1.)
            assert f"submission {value} of " in msg and "blk.7.attn_output" in msg, msg
            for use in (lambda: stream.record([ks.add(x, y, N)]), lambda: stream.read(y),
                        lambda: Stream(device).record([ks.add(y, y, N)])):
                with pytest.raises(DeviceLostError, match="device lost .* load the model again"):
                    use()
        finally:
            stream.release()     # the held work runs, so that closing does not wait forever
            stream.close()


def test_a_host_read_looks_only_at_its_own_buffers_ranges(device, kernels):
    """The last-use tables are kept by buffer: reading x after 40 other buffers were written
    looks at x's one range, however many ranges the stream ever bound (they grow with every
    view and staging slice: a decode step read them all, every token)."""
    stream = Stream(device, inflight=2)
    try:
        x, y = make(stream, 0, "x"), make(stream, 1, "y")
        others = [make(stream, i, f"o{i}") for i in range(40)]
        stream.record([kernels.add(o, y, N) for o in others] + [kernels.add(x, y, N)])
        stream.synchronize()
        before = stream.queue.ranges_scanned
        np.testing.assert_array_equal(stream.read(x), 1)
        assert stream.queue.ranges_scanned - before <= 2
    finally:
        stream.close()
