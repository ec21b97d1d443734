"""The runtime's contracts, on the device `Device()` picks (lavapipe here): interface errors
name the module, the binding or member and the numbers, out-of-memory is a `MemoryError` that
leaks nothing, the stream's counters count what it did, a dispatch's read and write sets come
from the reflected readable / writable flags, `Device.close` releases every child (the
validation layer reports any Vulkan object still alive at vkDestroyDevice), and a missing
driver is one line that says how to install one. The barrier tracker's own sequences are in
test_barriers.py.
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
from vkrt.kernels import Kernels
from vkrt.runtime.device import (PIPELINE_STATISTICS, VALIDATION_LAYER, Device, list_devices,
                                 validation_layer_available)
from vkrt.runtime.memory import Buffer
from vkrt.runtime.op import Op
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream
from vkrt.runtime.tensor import Tensor

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


def add_op(cache: PipelineCache) -> Op:
    return Op(cache.get_pipeline("add", {0: ELEMENTWISE}), ("float32", "float32"))


def add_n(stream: Stream, cache: PipelineCache, x: Tensor, y: Tensor, n: int) -> None:
    """x[:n] += y[:n]"""
    stream.record([add_op(cache)(x, y, grid=((n + ELEMENTWISE - 1) // ELEMENTWISE, 1, 1), n=n)])


def matvec_op(device: Device, cache: PipelineCache) -> Op:
    return Op(cache.get_pipeline("matvec_f32", {0: device.subgroup_size}))


def argmax_op(cache: PipelineCache) -> Op:
    return Op(cache.get_pipeline("argmax", {0: 256}))




needs_validation = pytest.mark.skipif(
    not validation_layer_available(),
    reason=f"{VALIDATION_LAYER} not installed (Debian: apt-get install vulkan-validationlayers)")


# -- interface errors ----------------------------------------------------------------------
@pytest.mark.parametrize("n_buffers", [1, 3])
def test_binding_count_mismatch_names_module_and_counts(rt, n_buffers):
    device, stream, cache = rt
    bufs = [stream.upload(np.zeros(4, np.float32)) for _ in range(n_buffers)]
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: shader declares 2 storage buffers, {n_buffers} bound$"):
        add_op(cache)(*bufs, grid=(1, 1, 1), n=4)
    for b in bufs:
        b.buffer.close()


@pytest.mark.parametrize("push,message", [
    ({}, r"^add: push constant 'n' not given; declared: n$"),
    ({"n": 4, "m": 1}, r"^add: no push constant 'm'; declared: n$"),
    ({"count": 4}, r"^add: push constant 'n' not given; declared: n$"),
    ({"n": -1}, r"^add: push constant 'n' is uint32; cannot take -1$"),
    ({"n": 2**32}, r"^add: push constant 'n' is uint32; cannot take 4294967296$"),
    ({"n": 1.5}, r"^add: push constant 'n' is uint32; cannot take 1.5$"),
])
def test_push_constants_by_name_refuse_missing_extra_and_out_of_range(rt, push, message):
    device, stream, cache = rt
    x, y = (stream.upload(np.zeros(4, np.float32)) for _ in range(2))
    with pytest.raises(ShaderInterfaceError, match=message):
        add_op(cache)(x, y, grid=(1, 1, 1), **push)
    # The stream is still usable after the refusal.
    stream.write(x, np.ones(4, np.float32))
    stream.write(y, np.full(4, 2, np.float32))
    add_n(stream, cache, x, y, 4)
    np.testing.assert_array_equal(stream.read(x), [3, 3, 3, 3])
    x.buffer.close()
    y.buffer.close()


def test_push_constants_packed_at_reflected_offsets(rt):
    device, _, cache = rt
    op = Op(cache.get_pipeline("attention", {0: 4}))
    assert op.push_names == ("n_heads", "n_kv_heads", "head_dim", "pos0", "scale")
    assert op.pack(dict(n_heads=9, n_kv_heads=3, head_dim=64, pos0=7, scale=0.125)) == \
        np.array([9, 3, 64, 7], np.uint32).tobytes() + np.float32(0.125).tobytes()
    # Order of the keywords does not matter, only the names.
    assert op.pack(dict(scale=0.125, pos0=7, head_dim=64, n_kv_heads=3, n_heads=9)) == \
        op.pack(dict(n_heads=9, n_kv_heads=3, head_dim=64, pos0=7, scale=0.125))


def test_view_dtype_and_size_refused_naming_binding(rt):
    device, stream, cache = rt
    k = Kernels(cache)
    x = stream.upload(np.zeros((2, 8), np.float32), name="x")
    w = stream.upload(np.zeros(8, np.float32), name="w")
    ids = stream.upload(np.zeros(2, np.uint32), name="ids")
    out = stream.upload(np.zeros(8, np.float32), name="out")
    with pytest.raises(ShaderInterfaceError,
                       match=r"^rmsnorm: binding 1 \(W\) takes float32, got uint32 tensor 'ids'$"):
        k.rmsnorm(x, ids, out, 2, 1e-5)
    with pytest.raises(ShaderInterfaceError,
                       match=r"^rmsnorm: binding 2 \(Out\) needs 16 float32, tensor 'out' holds 8$"):
        k.rmsnorm(x, w, out, 2, 1e-5)
    # A dispatch the op remembers is not reused for a view of the same bytes retyped.
    k.rmsnorm(x.rows(0, 1), w, out, 1, 1e-5)
    w_u32 = Tensor(w.buffer, 0, 32, "uint32", (8,), "w_u32")
    with pytest.raises(ShaderInterfaceError, match=r"^rmsnorm: binding 1 \(W\) takes float32"):
        k.rmsnorm(x.rows(0, 1), w_u32, out, 1, 1e-5)
    for t in (x, w, ids, out):
        t.buffer.close()


def test_view_past_its_buffer_is_refused_with_numbers(rt):
    device, _, _ = rt
    b = Buffer(device, 64, name="b")
    try:
        with pytest.raises(VkrtError, match=r"^tensor 'v': bytes 48\.\.80 do not lie inside "
                                            r"buffer 'b' of 64 bytes$"):
            Tensor(b, 48, 32, "float32", (8,), "v")
        with pytest.raises(VkrtError, match=r"shape \(3,\) of float32 is 12 bytes, the view has 16"):
            Tensor(b, 0, 16, "float32", (3,), "v")
        with pytest.raises(VkrtError, match=r"rows 2:5 outside 0:4"):
            Tensor.of(b, "float32", (4, 4)).rows(2, 5)
    finally:
        b.close()


def test_unaligned_view_offset_refused_at_binding(rt):
    device, stream, cache = rt
    align = device.min_storage_buffer_offset_alignment
    b = stream.upload(np.zeros(64, np.float32), name="b")
    y = stream.upload(np.zeros(4, np.float32), name="y")
    bad = Tensor(b.buffer, 4, 16, "float32", (4,), "b+4")
    if align == 4:  # pragma: no cover - no driver seen so far allows 4
        pytest.skip("minStorageBufferOffsetAlignment is 4: every f32 view is aligned")
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: binding 0 tensor 'b\+4' at byte offset 4, not a multiple of "
                             rf"the device's minStorageBufferOffsetAlignment {align}$"):
        add_n(stream, cache, bad, y, 4)
    b.buffer.close()
    y.buffer.close()


def test_grid_past_max_work_group_count_is_refused(rt):
    device, stream, cache = rt
    x, y = (stream.upload(np.zeros(4, np.float32)) for _ in range(2))
    limit = device.max_compute_work_group_count
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: grid \({limit[0] + 1}, 1, 1\) outside the device's "
                             rf"maxComputeWorkGroupCount \({limit[0]}, {limit[1]}, {limit[2]}\)$"):
        add_op(cache)(x, y, grid=(limit[0] + 1, 1, 1), n=4)
    with pytest.raises(ShaderInterfaceError, match=r"grid \(0, 1, 1\) outside"):
        add_op(cache)(x, y, grid=(0, 1, 1), n=4)
    x.buffer.close()
    y.buffer.close()


def test_unknown_spec_constant(rt):
    _, _, cache = rt
    with pytest.raises(ShaderInterfaceError, match=r"^matmul_f32: no specialization constant 'TILE'; "
                                                   r"declared: .*TOKENS=1"):
        cache.get_pipeline("matmul_f32", {0: 8, "TILE": 4})
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
    big = Buffer(device, device.max_storage_buffer_range + 4 - device.max_storage_buffer_range % 4,
                 name="big")
    y = stream.upload(np.zeros(4, np.float32))
    before = stream.counters.snapshot()
    try:
        with pytest.raises(ShaderInterfaceError,
                           match=rf"^add: binding 0 tensor 'big' of {big.nbytes} bytes exceeds the "
                                 rf"device's maxStorageBufferRange "
                                 rf"{device.max_storage_buffer_range}$"):
            add_n(stream, cache, Tensor(big, 0, big.nbytes, "float32", (big.nbytes // 4,)), y, 4)
        assert stream.counters.since(before)["dispatches"] == 0
        # A view of the same buffer inside the limit binds (several tensors in one buffer).
        add_n(stream, cache, Tensor.of(big, "float32", (4,), offset=1 << 20), y, 4)
        assert stream.counters.since(before)["dispatches"] == 1
    finally:
        big.close()
        y.buffer.close()


# -- counters ------------------------------------------------------------------------------
# Barriers before 5 chained adds and the read of their result. Tracked: adds 2-5 read x that
# the previous add wrote (RAW); through staging (the uploads and the readback are copies) the
# first add reads y that a copy wrote and the readback copy reads x (2 transfer barriers).
# Always: one before every dispatch and copy, 5 on mapped memory, 6 through staging.
EXPECTED_BARRIERS = {("tracked", False): 4, ("tracked", True): 6,
                     ("always", False): 5, ("always", True): 6}


@pytest.mark.parametrize("mode", ["tracked", "always"])
def test_counters_after_dispatches_and_one_read(rt, mode):
    device, _, cache = rt
    stream = Stream(device, barriers=mode)
    try:
        n, n_dispatches = 100, 5
        x = stream.upload(np.zeros(n, np.float32))
        y = stream.upload(np.arange(n, dtype=np.float32))
        stream.finish()
        before = stream.counters.snapshot()
        for _ in range(n_dispatches):
            add_n(stream, cache, x, y, n)
        got = stream.read(x)
        delta = stream.counters.since(before)
        # A device buffer the host cannot map ("staging") is read through a staging copy
        # recorded into the same submission: still one submit and one wait.
        staging = x.buffer.mapped is None
        assert delta["dispatches"] == n_dispatches
        assert delta["copies"] == (1 if staging else 0)
        assert delta["barriers"] == EXPECTED_BARRIERS[mode, staging]
        assert delta["barriers_raw"] == n_dispatches - 1
        assert delta["barriers_transfer"] == (2 if staging else 0)
        assert delta["barriers_waw"] == delta["barriers_war"] == 0
        assert delta["submits"] == 1
        assert delta["waits_blocked"] + delta["waits_ready"] == 1   # the read, for that submit
        assert delta["host_reads"] == 1 and delta["read_bytes"] == n * 4
        # The dispatches were ordered: x = 5 * y exactly (small integers).
        np.testing.assert_array_equal(got, n_dispatches * np.arange(n, dtype=np.float32))
        x.buffer.close()
        y.buffer.close()
    finally:
        stream.close()


def test_descriptor_set_written_once_per_view_tuple(rt):
    device, stream, cache = rt
    x, y = (stream.upload(np.zeros(8, np.float32)) for _ in range(2))
    before = stream.counters.snapshot()
    add_n(stream, cache, x, y, 8)
    assert stream.counters.since(before)["descriptor_sets"] == 1
    add_n(stream, cache, x, y, 8)   # same views, same order: the cached set
    add_n(stream, cache, Tensor.of(x.buffer, "float32"), y, 8)   # an equal view: cached too
    assert stream.counters.since(before)["descriptor_sets"] == 1
    add_n(stream, cache, y, x, 8)   # swapped: a different binding, a new set
    assert stream.counters.since(before)["descriptor_sets"] == 2
    add_n(stream, cache, x.rows(4, 8), y, 4)   # another range of the same buffer: a new set
    assert stream.counters.since(before)["descriptor_sets"] == 3
    stream.finish()
    add_n(stream, cache, x, y, 8)   # the cache outlives a submit
    stream.finish()
    assert stream.counters.since(before)["descriptor_sets"] == 3
    x.buffer.close()
    y.buffer.close()


def test_views_bind_their_offset_and_range(rt):
    """Two tensors in one buffer: an add on the second view leaves the first untouched."""
    device, stream, cache = rt
    align = device.min_storage_buffer_offset_alignment // 4
    both = stream.upload(np.zeros(2 * align + 8, np.float32), name="both")
    first, second = both.rows(0, align), both.rows(2 * align, 2 * align + 8)
    y = stream.upload(np.arange(8, dtype=np.float32))
    add_n(stream, cache, second, y, 8)
    got = stream.read(both)
    np.testing.assert_array_equal(got[:2 * align], 0)
    np.testing.assert_array_equal(got[2 * align:], np.arange(8))
    np.testing.assert_array_equal(stream.read(first), 0)
    both.buffer.close()
    y.buffer.close()


# -- read and write sets -------------------------------------------------------------------
def test_read_and_write_sets_come_from_reflected_access(rt):
    device, stream, cache = rt
    n = 16
    b = [stream.upload(np.ones(n, np.float32), name=f"b{i}") for i in range(4)]
    r = [t.range for t in b]
    # add: X (binding 0) read and written, Y (1) readonly.
    d = add_op(cache)(b[0], b[1], grid=(1, 1, 1), n=n)
    assert (d.reads, d.writes) == ([r[0], r[1]], [r[0]])
    # matvec: W (0), X (1) readonly, Y (2) writeonly: not read.
    d = matvec_op(device, cache)(b[2], b[1], b[3], grid=(4, 1, 1), n_cols=4, x_offset=0,
                                         n_rows=4)
    assert (d.reads, d.writes) == ([r[2], r[1]], [r[3]])
    # attention: q, k, v (0-2) readonly, out (3) writeonly.
    d = Op(cache.get_pipeline("attention", {0: 4}))(
        b[0], b[1], b[2], b[3], grid=(1, 1, 1), n_heads=1, n_kv_heads=1, head_dim=4, pos0=0,
        scale=0.5)
    assert (d.reads, d.writes) == ([r[0], r[1], r[2]], [r[3]])
    # argmax: logits (0) readonly, token (1) writeonly.
    d = argmax_op(cache)(b[3], b[2], grid=(1, 1, 1), n=n, offset=0)
    assert (d.reads, d.writes) == ([r[3]], [r[2]])
    for t in b:
        t.buffer.close()


# -- device lifetime and validation --------------------------------------------------------
def _some_work(device: Device) -> tuple[Stream, list[Buffer], np.ndarray]:
    """A stream, a pipeline cache with three pipelines, buffers, a few dispatches and a read."""
    stream, cache = Stream(device), PipelineCache(device)
    n = 100
    x, y = stream.upload(np.ones(n, np.float32)), stream.upload(np.full(n, 2, np.float32))
    w = stream.upload(np.ones((3, n), np.float32))
    out = Tensor.of(Buffer(device, 3 * 4, name="out"), "float32")
    for _ in range(3):
        add_n(stream, cache, x, y, n)
    token = Tensor.of(Buffer(device, 4, name="token"), "uint32")
    stream.record([matvec_op(device, cache)(w, x, out, grid=(3, 1, 1), n_cols=n, x_offset=0,
                                           n_rows=3),
                   argmax_op(cache)(out, token, grid=(1, 1, 1), n=3, offset=0)])
    return stream, [t.buffer for t in (x, y, w, out, token)], stream.read(out)


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
    assert stream.queue is None
    device.close()  # a second close is harmless


def test_pipeline_statistics_are_opt_in_and_refused_where_not_offered():
    """Device(pipeline_statistics=True) enables VK_KHR_pipeline_executable_properties (every
    pipeline then captures its statistics) or, where the device does not offer it, raises
    naming it; Pipeline.statistics() of a device opened without it raises. (The statistics themselves
    come from a driver that offers them: bench/matvec_types.py --pipeline-stats on a GPU.)"""
    with Device() as device:
        assert device.features["pipelineExecutableInfo"] is False
        pipeline = PipelineCache(device).get_pipeline("matvec_q4_k", {})
        with pytest.raises(VkrtError, match=r"^matvec_q4_k: pipeline statistics need "
                                            r"Device\(pipeline_statistics=True\)$"):
            pipeline.statistics()
        offered = device._offers(PIPELINE_STATISTICS)
    if offered:
        with Device(pipeline_statistics=True) as device:
            assert device.features["pipelineExecutableInfo"] is True
            stats = PipelineCache(device).get_pipeline("matvec_q4_k", {}).statistics()
            assert stats and all(isinstance(k, str) for k in stats)
        return
    with pytest.raises(VkrtError, match=rf": pipeline statistics need "
                                        rf"{PIPELINE_STATISTICS} with its "
                                        r"pipelineExecutableInfo feature, which this device "
                                        r"does not offer$"):
        Device(pipeline_statistics=True)


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
        assert a.buffer.mapped is None and b.buffer.mapped is None
        before = stream.counters.snapshot()
        stream.write(a, x + 1)                                     # staging copy, recorded
        add_n(stream, cache, a, b, 100)
        got = stream.read(a)
        d = stream.counters.since(before)
        np.testing.assert_array_equal(got, 3 * x + 1)
        # The write records its staging copy without waiting; the read's copy joins the same
        # batch: one submit, one wait.
        assert d["submits"] == d["waits_blocked"] + d["waits_ready"] == 1
        stream.close()


@pytest.mark.parametrize("value", [1.5, -3, 2**32])
def test_spec_constant_value_out_of_type(rt, value):
    _, _, cache = rt
    with pytest.raises(ShaderInterfaceError,
                       match=rf"^add: specialization constant 0 is uint32; cannot take {value}$"):
        cache.get_pipeline("add", {0: value})


def test_fence_timeout_is_a_clear_error():
    """A submission that outlasts VKRT_FENCE_TIMEOUT_S raises a VkrtError naming the switch
    (the CLI prints it as one line), not a bare TimeoutError. The submission waits for the
    host (`Stream.hold`), so it outlasts the timeout on any GPU."""
    with Device() as dev:
        stream, cache = Stream(dev), PipelineCache(dev)
        x, y = (stream.upload(np.ones(4, np.float32)) for _ in range(2))
        stream.synchronize()
        stream.hold()
        add_n(stream, cache, x, y, 4)
        with config.FENCE_TIMEOUT_S.override("0.2"):
            with pytest.raises(VkrtError, match=r"did not finish within 0.2 s "
                                                r"\(VKRT_FENCE_TIMEOUT_S\) on .*: waited for "
                                                r"submission \d+, \d+ done$"):
                stream.finish()
        stream.release()
        np.testing.assert_array_equal(stream.read(x), 2)


@pytest.mark.parametrize("seconds,ns", [(0.5, 500_000_000), (0.0, 0), (float("inf"), 2**64 - 1),
                                       (1e30, 2**64 - 1), (2**64 / 1e9, 2**64 - 1)])
def test_fence_timeout_in_nanoseconds(seconds, ns):
    from vkrt.runtime.queue import timeout_ns
    assert timeout_ns(seconds) == ns


def test_infinite_fence_timeout_waits(rt):
    device, stream, cache = rt
    x, y = (stream.upload(np.ones(4, np.float32)) for _ in range(2))
    add_n(stream, cache, x, y, 4)
    with config.FENCE_TIMEOUT_S.override("inf"):
        np.testing.assert_array_equal(stream.read(x), 2)
    x.buffer.close()
    y.buffer.close()


INF_MODULES = ("argmax", "attention", "attention_combine", "attention_decode",
               "attention_split", "rmsnorm", "matvec_glu_f32", "qkv_rope_f32")


def test_modules_relying_on_infinities_declare_them_kept():
    """Kernels that compare with -inf or test for overflow (inf.glsl) carry the execution
    mode SignedZeroInfNanPreserve 32, as the reflection reports it and as spirv-dis (the
    independent disassembler) shows it; a kernel that does not include inf.glsl has none."""
    from vkrt.gen.metadata import load_modules

    modules = load_modules()
    dis = next(Path(sys.prefix).glob("lib/python*/site-packages/cmeel.prefix/bin/spirv-dis"))
    for name in INF_MODULES + ("add", "matvec_f32"):
        spv = REPO / "vkrt" / "spirv" / f"{name}.spv"
        text = subprocess.run([dis, spv], capture_output=True, text=True, check=True,
                              env={**os.environ, "LD_LIBRARY_PATH": str(dis.parent.parent / "lib")}
                              ).stdout
        declared = "OpExecutionMode %main SignedZeroInfNanPreserve 32" in text
        assert declared == (name in INF_MODULES), name
        assert modules[name].signed_zero_inf_nan_preserve == ((32,) if declared else ()), name


def test_pipeline_refuses_a_device_that_does_not_keep_infinities(rt):
    device, _, _ = rt
    kept = device.inf_nan_preserve
    device.inf_nan_preserve = {**kept, 32: False}
    try:
        with pytest.raises(ShaderInterfaceError, match=r"^argmax: keeps IEEE infinities and "
                           r"NaNs of 32-bit floats .* \(shaderSignedZeroInfNanPreserveFloat32\)$"):
            PipelineCache(device).get_pipeline("argmax", {0: 64})
        PipelineCache(device).get_pipeline("add", {0: 64})   # declares nothing: built
    finally:
        device.inf_nan_preserve = kept


def test_workgroup_past_the_device_limits_refused_before_the_pipeline(rt):
    """attention runs one invocation per head dimension (local_size_x = head_dim): a head
    size past maxComputeWorkGroupSize or maxComputeWorkGroupInvocations is refused in one
    line naming the module and the numbers, and so is a model needing it (its Kernels)."""
    device, _, cache = rt
    lim = device.limits
    too_many = min(lim.maxComputeWorkGroupInvocations, lim.maxComputeWorkGroupSize[0]) + 4
    with pytest.raises(ShaderInterfaceError, match=rf"^attention: workgroup {too_many}x1x1 "
                       rf"\({too_many} invocations\) is past .*maxComputeWorkGroupInvocations "
                       rf"{lim.maxComputeWorkGroupInvocations}$"):
        cache.get_pipeline("attention", {0: too_many})
    with pytest.raises(ShaderInterfaceError, match="^attention: workgroup"):
        Kernels(cache, head_dim=too_many)
