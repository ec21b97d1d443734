"""The runtime's contracts, on the device `Device()` picks (lavapipe here): interface errors
name the module and both numbers, out-of-memory is a `MemoryError` that leaks nothing, the
stream's counters count what it did, the barrier policy sees the read/write sets the
reflected `writable_mask` implies, `Device.close` releases every child (the validation layer
reports any Vulkan object still alive at vkDestroyDevice), and a missing driver is one line
that says how to install one.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import vulkan

from vkrt import config
from vkrt.errors import DeviceMemoryError, ShaderInterfaceError, VkrtError
from vkrt.runtime.device import VALIDATION_LAYER, Device, list_devices
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream

REPO = Path(__file__).resolve().parents[1]
ELEMENTWISE = 64


@pytest.fixture(scope="module", params=[None, False], ids=["host-access", "staging"])
def rt(request):
    # "staging": device memory the host does not map, the path of a discrete GPU (on lavapipe
    # forced with direct_host_access=False); a recorded-not-submitted copy must stay valid.
    device = Device(direct_host_access=request.param)
    stream = Stream(device)
    cache = PipelineCache(device)
    yield device, stream, cache
    device.close()
    assert device._children == {}


def u32(*values) -> np.ndarray:
    return np.array(values, np.uint32)


def add_n(stream: Stream, cache: PipelineCache, x: Buffer, y: Buffer, n: int) -> None:
    stream.dispatch(cache.get_pipeline("add", {0: ELEMENTWISE}), (x, y),
                    ((n + ELEMENTWISE - 1) // ELEMENTWISE, 1, 1), u32(n))


def validation_layer_installed() -> bool:
    return VALIDATION_LAYER in [p.layerName for p in vulkan.vkEnumerateInstanceLayerProperties()]


needs_validation = pytest.mark.skipif(
    not validation_layer_installed(),
    reason=f"{VALIDATION_LAYER} not installed (Debian: apt-get install vulkan-validationlayers)")


# -- interface errors ----------------------------------------------------------------------
@pytest.mark.parametrize("n_buffers", [1, 3])
def test_binding_count_mismatch_names_module_and_counts(rt, n_buffers):
    device, stream, cache = rt
    bufs = [stream.upload(np.zeros(4, np.float32)) for _ in range(n_buffers)]
    before = stream.counters.snapshot()
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: shader declares 2 storage buffers, {n_buffers} bound$"):
        stream.dispatch(cache.get_pipeline("add", {0: ELEMENTWISE}), bufs, (1, 1, 1), u32(4))
    # Refused before anything was recorded.
    assert stream.counters.since(before)["dispatches"] == 0
    for b in bufs:
        b.close()


@pytest.mark.parametrize("push,given", [(u32(4, 0), 8), (None, 0), (b"\0\0", 2)])
def test_push_constant_size_mismatch_names_module_and_sizes(rt, push, given):
    device, stream, cache = rt
    x, y = (stream.upload(np.zeros(4, np.float32)) for _ in range(2))
    before = stream.counters.snapshot()
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: shader declares 4 bytes of push constants, {given} given$"):
        stream.dispatch(cache.get_pipeline("add", {0: ELEMENTWISE}), (x, y), (1, 1, 1), push)
    assert stream.counters.since(before)["dispatches"] == 0
    # The stream is still usable after the refusal.
    stream.write(x, np.ones(4, np.float32))
    stream.write(y, np.full(4, 2, np.float32))
    add_n(stream, cache, x, y, 4)
    np.testing.assert_array_equal(stream.read(x), [3, 3, 3, 3])
    x.close()
    y.close()


def test_unknown_spec_constant(rt):
    _, _, cache = rt
    with pytest.raises(ShaderInterfaceError, match=r"^matmul: no specialization constant 'TILE'; "
                                                   r"declared: .*TOKENS=1"):
        cache.get_pipeline("matmul", {0: 8, "TILE": 4})
    with pytest.raises(ShaderInterfaceError, match=r"^add: no specialization constant 7"):
        cache.get_pipeline("add", {7: 1})


def test_unknown_module(rt):
    _, _, cache = rt
    with pytest.raises(ShaderInterfaceError, match=r"no shader module 'softmax'; known: add, .*matvec"):
        cache.get_pipeline("softmax")


# -- memory --------------------------------------------------------------------------------
def test_out_of_device_memory_is_a_memory_error_and_leaks_nothing(rt):
    device, _, _ = rt
    in_use, children = device.bytes_in_use, dict(device._children)
    nbytes = 2**44  # 16 TiB: more than any heap (lavapipe: 2 GiB)
    with pytest.raises(MemoryError) as info:
        Buffer(device, nbytes, name="huge")
    assert isinstance(info.value, DeviceMemoryError)
    assert f"allocating {nbytes} bytes for buffer 'huge'" in str(info.value)
    assert f"{in_use} bytes in use" in str(info.value)
    assert device.bytes_in_use == in_use
    assert device._children == children


class FailingLib:
    """`vulkan.lib` with the calls in `fail` returning the given VkResult: the allocation steps
    lavapipe never refuses (it overcommits: a 4 GiB buffer on its 2 GiB heap succeeds; only
    vkCreateBuffer refuses sizes of 4 GiB and more)."""

    def __init__(self, lib, fail: dict[str, int]):
        self._lib, self._fail = lib, fail

    def __getattr__(self, name):
        if name in self._fail:
            return lambda *args: self._fail[name]
        return getattr(self._lib, name)


@needs_validation
@pytest.mark.parametrize("failing,result,error,message", [
    ("vkAllocateMemory", vulkan.VK_ERROR_OUT_OF_DEVICE_MEMORY, DeviceMemoryError,
     r"allocating 4096 bytes for buffer 'w' on .*: 0 bytes in use "
     r"\(vkAllocateMemory: VK_ERROR_OUT_OF_DEVICE_MEMORY\)"),
    ("vkBindBufferMemory", vulkan.VK_ERROR_OUT_OF_DEVICE_MEMORY, DeviceMemoryError,
     r"allocating 4096 bytes for buffer 'w' on .*: 0 bytes in use "
     r"\(vkBindBufferMemory: VK_ERROR_OUT_OF_DEVICE_MEMORY\)"),
    ("vkMapMemory", vulkan.VK_ERROR_MEMORY_MAP_FAILED, vulkan.VkErrorMemoryMapFailed,
     r"vkMapMemory"),
])
def test_failed_allocation_step_frees_what_it_made(monkeypatch, failing, result, error, message):
    from vkrt.runtime import memory

    device = Device(validation=True)
    if failing == "vkMapMemory" and device.info.kind not in ("cpu", "integrated"):
        device.close()
        pytest.skip("device buffers are mapped only where device memory is host-visible")
    try:
        monkeypatch.setattr(memory, "lib", FailingLib(memory.lib, {failing: result}))
        with pytest.raises(error, match=message):
            Buffer(device, 4096, name="w")
        monkeypatch.undo()
        assert device.bytes_in_use == 0
        assert device._children == {}
    finally:
        device.close()
    # No VkBuffer or VkDeviceMemory left alive at vkDestroyDevice.
    assert device.validation_errors == []


def test_buffer_past_max_storage_buffer_range(rt):
    device, stream, cache = rt
    # lavapipe: maxStorageBufferRange 128 MiB, heap 2 GiB. Binding the whole buffer as one
    # storage-buffer descriptor past the limit is invalid (VUID-VkWriteDescriptorSet-descriptorType-00333).
    big = Buffer(device, device.max_storage_buffer_range + 4, name="big")
    y = stream.upload(np.zeros(4, np.float32))
    before = stream.counters.snapshot()
    try:
        with pytest.raises(ShaderInterfaceError,
                           match=rf"^add: buffer 'big' of {device.max_storage_buffer_range + 4} "
                                 rf"bytes exceeds the device's maxStorageBufferRange "
                                 rf"{device.max_storage_buffer_range}$"):
            add_n(stream, cache, big, y, 4)
        assert stream.counters.since(before)["dispatches"] == 0
    finally:
        big.close()
        y.close()


# -- counters ------------------------------------------------------------------------------
def test_counters_after_dispatches_and_one_read(rt):
    device, stream, cache = rt
    n, n_dispatches = 100, 5
    x, y = stream.upload(np.zeros(n, np.float32)), stream.upload(np.arange(n, dtype=np.float32))
    before = stream.counters.snapshot()
    for _ in range(n_dispatches):
        add_n(stream, cache, x, y, n)
    got = stream.read(x)
    delta = stream.counters.since(before)
    # A device buffer the host cannot map ("staging") is read through a staging copy recorded
    # into the same submission: still one submit and one wait, and the copy's barrier is not
    # counted among the dispatch barriers.
    assert delta["dispatches"] == n_dispatches
    assert delta["barriers"] == n_dispatches  # FullBarrier: one before each dispatch
    assert delta["submits"] == 1
    assert delta["fence_waits"] == 1
    assert delta["host_reads"] == 1 and delta["read_bytes"] == n * 4
    # The dispatches were ordered: x = 5 * y exactly (small integers).
    np.testing.assert_array_equal(got, n_dispatches * np.arange(n, dtype=np.float32))
    x.close()
    y.close()


def test_descriptor_set_written_once_per_buffer_tuple(rt):
    device, stream, cache = rt
    x, y = (stream.upload(np.zeros(8, np.float32)) for _ in range(2))
    before = stream.counters.snapshot()
    add_n(stream, cache, x, y, 8)
    assert stream.counters.since(before)["descriptor_sets"] == 1
    add_n(stream, cache, x, y, 8)   # same buffers, same order: the cached set
    add_n(stream, cache, x, y, 8)
    assert stream.counters.since(before)["descriptor_sets"] == 1
    add_n(stream, cache, y, x, 8)   # swapped: a different binding, a new set
    assert stream.counters.since(before)["descriptor_sets"] == 2
    stream.finish()
    add_n(stream, cache, x, y, 8)   # the cache outlives a submit
    stream.finish()
    assert stream.counters.since(before)["descriptor_sets"] == 2
    x.close()
    y.close()


# -- barrier policy ------------------------------------------------------------------------
class RecordingPolicy:
    """A barrier policy that records what the stream tells it and answers `answer`."""

    def __init__(self, answer: bool):
        self.answer, self.calls, self.resets = answer, [], 0

    def before_dispatch(self, reads: tuple, writes: tuple) -> bool:
        self.calls.append((set(reads), set(writes)))
        return self.answer

    def reset(self) -> None:
        self.resets += 1


@pytest.mark.parametrize("answer", [True, False])
def test_barrier_policy_sees_reflected_reads_and_writes(rt, answer):
    device, _, cache = rt
    policy = RecordingPolicy(answer)
    stream = Stream(device, barriers=policy)
    try:
        n = 16
        b = [stream.upload(np.ones(n, np.float32)) for _ in range(4)]
        s = [buf.serial for buf in b]
        # Uploads through a staging copy (a discrete GPU) drain the stream: count from here.
        before, resets = stream.counters.snapshot(), policy.resets
        # add: x (binding 0) read-write, y (1) readonly -> reads {y}, writes {x}.
        add_n(stream, cache, b[0], b[1], n)
        # matvec: W (0), x (1) readonly, y (2) writeonly. W [4, 4] @ x[0:4].
        stream.dispatch(cache.get_pipeline("matvec", {0: device.subgroup_size}),
                        (b[2], b[1], b[3]), (4, 1, 1), u32(4, 0))
        # attention: q, k, v (0-2) readonly, out (3) writeonly.
        stream.dispatch(cache.get_pipeline("attention", {0: 4}), (b[0], b[1], b[2], b[3]),
                        (1, 1, 1), np.array([1, 1, 4, 0, np.float32(0.5).view(np.uint32)],
                                            np.uint32))
        # argmax: logits (0) readonly, token (1) writeonly.
        stream.dispatch(cache.get_pipeline("argmax", {0: 256}), (b[3], b[2]), (1, 1, 1),
                        u32(n, 0))
        assert policy.calls == [
            ({s[1]}, {s[0]}),
            ({s[2], s[1]}, {s[3]}),
            ({s[0], s[1], s[2]}, {s[3]}),
            ({s[3]}, {s[2]}),
        ]
        assert stream.counters.since(before)["barriers"] == (4 if answer else 0)
        assert policy.resets == resets
        stream.finish()
        assert policy.resets == resets + 1  # told to forget once the queue is idle
        # Nothing else consulted the policy or recorded a barrier of its own.
        assert len(policy.calls) == 4
        assert stream.counters.since(before)["barriers"] == (4 if answer else 0)
        for buf in b:
            buf.close()
    finally:
        stream.close()


# -- device lifetime and validation --------------------------------------------------------
def _some_work(device: Device) -> tuple[Stream, list[Buffer], np.ndarray]:
    """A stream, a pipeline cache with three pipelines, buffers, a few dispatches and a read."""
    stream, cache = Stream(device), PipelineCache(device)
    n = 100
    x, y = stream.upload(np.ones(n, np.float32)), stream.upload(np.full(n, 2, np.float32))
    w = stream.upload(np.ones((3, n), np.float32))
    out = Buffer(device, 3 * 4, name="out")
    for _ in range(3):
        add_n(stream, cache, x, y, n)
    stream.dispatch(cache.get_pipeline("matvec", {0: device.subgroup_size}), (w, x, out),
                    (3, 1, 1), u32(n, 0))
    token = Buffer(device, 4, name="token")
    stream.dispatch(cache.get_pipeline("argmax", {0: 256}), (out, token), (1, 1, 1), u32(3, 0))
    return stream, [x, y, w, out, token], stream.read(out)


def test_device_close_releases_every_child():
    device = Device()
    stream, buffers, got = _some_work(device)
    np.testing.assert_array_equal(got, [700, 700, 700])  # sum of 100 ones times (1 + 3 * 2)
    assert device.bytes_in_use > 0
    assert len(device._children) >= len(buffers) + 1 + 3  # buffers, stream, pipelines
    device.close()
    assert device._children == {}
    assert device.bytes_in_use == 0
    assert all(b.handle is None and b.memory is None for b in buffers)
    assert stream.pool is None and stream.fence is None
    device.close()  # a second close is harmless


@needs_validation
def test_validation_reports_nothing_for_ordinary_work():
    with config.VALIDATION.override("1"):
        device = Device()
    assert device.validation
    try:
        _, _, got = _some_work(device)  # finish() raises ValidationError on any message
        np.testing.assert_array_equal(got, [700, 700, 700])
        assert device.validation_errors == []
    finally:
        # Closing with the layer on also checks that close destroyed every object it made:
        # a leak is reported at vkDestroyDevice (VUID-vkDestroyDevice-device-00378).
        device.close()
    assert device.validation_errors == []


@needs_validation
def test_validation_sees_a_leaked_object():
    # The net the two tests above rely on: a buffer the device forgets is reported.
    device = Device(validation=True)
    leaked = Buffer(device, 64, name="leaked")
    device.release(leaked)
    device.close()
    assert any("VUID-vkDestroyDevice-device-00378" in m for m in device.validation_errors)


# -- device choice and a missing driver ----------------------------------------------------
def test_list_devices():
    devices = list_devices()
    assert devices, "no Vulkan device"
    assert [d.index for d in devices] == list(range(len(devices)))
    assert all(d.name and re.fullmatch(r"\d+\.\d+\.\d+", d.api_version) for d in devices)


def test_device_index_out_of_range_names_the_count():
    count = len(list_devices())
    with pytest.raises(VkrtError, match=rf"device index 99 out of range: {count} Vulkan device"):
        Device(index=99)
    with config.DEVICE.override("99"), pytest.raises(VkrtError, match="device index 99"):
        Device()


def test_missing_driver_is_one_line_saying_how_to_install():
    env = dict(os.environ, VK_DRIVER_FILES="/nonexistent.json",
               VK_ICD_FILENAMES="/nonexistent.json")
    proc = subprocess.run([sys.executable, "-m", "vkrt.cli", "devices"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("vkrt: error: ")
    assert "mesa-vulkan-drivers" in lines[0] and "lavapipe" in lines[0]


def test_staging_path_round_trip_and_one_submit_per_read():
    """The path a discrete GPU takes (device memory the host cannot map), forced on lavapipe:
    writes and reads go through staging copies recorded into the stream's own submissions."""
    with Device(direct_host_access=False) as dev:
        stream, cache = Stream(dev), PipelineCache(dev)
        x = np.arange(100, dtype=np.float32)
        a, b = stream.upload(x, name="a"), stream.upload(2 * x, name="b")
        assert a.mapped is None and b.mapped is None
        before = stream.counters.snapshot()
        stream.write(a, x + 1)                                     # staging copy, recorded
        stream.dispatch(cache.get_pipeline("add", {0: 64}), (a, b), (2, 1, 1),
                        np.array([100], np.uint32))
        got = stream.read(a)
        d = stream.counters.since(before)
        np.testing.assert_array_equal(got, 3 * x + 1)
        assert d["submits"] == d["fence_waits"] == 2               # write drains, read submits once
        stream.close()


@pytest.mark.parametrize("value", [1.5, -3, 2**32])
def test_spec_constant_value_out_of_type(rt, value):
    _, _, cache = rt
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: specialization constant 0 is uint32; cannot take {value}$"):
        cache.get_pipeline("add", {0: value})


def test_fence_timeout_is_a_clear_error():
    """A submission that outlasts VKRT_FENCE_TIMEOUT_S raises a VkrtError naming the switch
    (the CLI prints it as one line), not a bare TimeoutError."""
    with Device() as dev:
        stream, cache = Stream(dev), PipelineCache(dev)
        rows, cols = 4096, 4096                               # 64 MiB of weights: ~tens of ms
        w = stream.upload(np.ones((rows, cols), np.float32))
        x = stream.upload(np.ones(cols, np.float32))
        y = Buffer(dev, rows * 4)
        stream.dispatch(cache.get_pipeline("matvec", {0: dev.subgroup_size}), (w, x, y),
                        (rows, 1, 1), np.array([cols, 0], np.uint32))
        with config.FENCE_TIMEOUT_S.override("1e-9"):
            with pytest.raises(VkrtError, match=r"did not finish within 1e-09 s \(VKRT_FENCE_TIMEOUT_S\)"):
                stream.finish()
        dev.wait_idle()
