"""Device buffers a forward works in, shared by the model families: one buffer of disjoint
activation views (`arena`), the KV cache (`kv_cache`, `KVBuffers`), and the rule that
reallocates the activations only when a forward needs more than they hold (`grow`).

Every view starts at a multiple of the device's minStorageBufferOffsetAlignment (a descriptor
binds exactly the view, Vulkan spec VUID-VkWriteDescriptorSet-descriptorType-00328).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from vkrt.runtime.memory import Buffer
from vkrt.runtime.tensor import Tensor

# --kv-cache-dtype -> a KV cache's element dtype (`kv_cache`'s dtype: one sequence's cache,
# `vkrt.load(kv_cache_dtype=)`, and the paged cache, `setup_paged_cache`'s kv_dtype): f32, or
# f16 (K and V rounded to f16 as they are stored, half the bytes; vkrt/glsl/kv.glsl).
KV_CACHE_DTYPES = {"f32": "float32", "f16": "float16"}


def aligned(nbytes: int, align: int) -> int:
    """`nbytes` rounded up to a multiple of `align`."""
    return -(-nbytes // align) * align


def arena(device, layout: dict[str, tuple[str, tuple[int, ...]]],
          name: str = "activations") -> tuple[Buffer, dict[str, Tensor]]:
    """One buffer holding a view per `layout` entry (name: (dtype, shape)), in order, each at
    an aligned offset; returns the buffer and the views by name (4-byte dtypes)."""
    align = device.min_storage_buffer_offset_alignment
    offsets, end = {}, 0
    for key, (_, shape) in layout.items():
        offsets[key] = end
        end += aligned(int(np.prod(shape)) * 4, align)
    buffer = Buffer(device, end, name=name)
    views = {key: Tensor(buffer, offsets[key], int(np.prod(shape)) * 4, dtype, shape, key)
             for key, (dtype, shape) in layout.items()}
    return buffer, views


class KVBuffers:
    """The buffers one KV cache's views live in (`kv_cache`): `buffers` in layer order,
    each within the device's maxMemoryAllocationSize where one view fits it (Vulkan spec
    VkPhysicalDeviceMaintenance3Properties: a larger allocation may fail, as on lavapipe).
    `serial`: the first buffer's (they are made and freed together, so a recording keyed by
    it is captured again after a reallocation); `nbytes`: their sizes' sum;
    `allocation_bytes`: their allocations' (what `Device.bytes_in_use` counts)."""

    def __init__(self, buffers: list[Buffer]):
        self.buffers = buffers
        self.serial = buffers[0].serial
        self.nbytes = sum(b.nbytes for b in buffers)
        self.allocation_bytes = sum(b.allocation_bytes for b in buffers)

    def close(self) -> None:
        for b in self.buffers:
            b.close()


def kv_cache(device, n_layer: int, max_seq: int, width: int, name: Callable[[int, str], str],
             dtype: str = "float32") -> tuple[KVBuffers, list[Tensor], list[Tensor]]:
    """Per layer i, K and V views of `[max_seq, width]` `dtype` (float32 or float16) named
    `name(i, "k_cache")` and `name(i, "v_cache")`, each at an aligned offset, in as few
    buffers as maxMemoryAllocationSize allows (consecutive views share one); returns (the
    buffers, k views, v views). Raises DeviceMemoryError (nothing left allocated) when one
    does not fit."""
    nbytes = max_seq * width * np.dtype(dtype).itemsize
    stride = _kv_stride(device, max_seq, width, dtype)
    n_views = 2 * n_layer
    per_buffer = max(1, min(n_views, device.max_memory_allocation_size // stride))
    buffers: list[Buffer] = []
    try:
        for first in range(0, n_views, per_buffer):
            count = min(per_buffer, n_views - first)
            buffers.append(Buffer(device, count * stride, name="kv_cache"))
    except BaseException:
        for b in buffers:
            b.close()
        raise

    def view(j: int, what: str) -> Tensor:
        return Tensor(buffers[j // per_buffer], j % per_buffer * stride, nbytes, dtype,
                      (max_seq, width), name(j // 2, what))

    return (KVBuffers(buffers), [view(2 * i, "k_cache") for i in range(n_layer)],
            [view(2 * i + 1, "v_cache") for i in range(n_layer)])


def kv_cache_bytes(device, n_layer: int, max_seq: int, width: int,
                   dtype: str = "float32") -> int:
    """Bytes of `kv_cache(device, n_layer, max_seq, width, ..., dtype)`'s buffers: 2 *
    n_layer views of max_seq * width elements, each starting at an aligned offset."""
    return 2 * n_layer * _kv_stride(device, max_seq, width, dtype)


def _kv_stride(device, max_seq: int, width: int, dtype: str) -> int:
    """Bytes from one K/V view to the next: the view's, aligned."""
    return aligned(max_seq * width * np.dtype(dtype).itemsize,
                   device.min_storage_buffer_offset_alignment)


def grow(current, n_tokens: int, logit_rows: int, ring: int,
         allocate: Callable[[int, int, int], object]):
    """`current` activations (with `n_tokens`, `logit_rows`, `tokens`, `close()`) when they
    hold a forward of `n_tokens` tokens, `logit_rows` rows of logits and a token ring of
    `ring` slots; else closes them (the buffer is freed once in-flight steps are done) and
    returns `allocate(n, rows, ring)` sized for the larger of the old and the new needs."""
    a = current
    if (a is not None and a.n_tokens >= n_tokens and a.logit_rows >= logit_rows
            and len(a.tokens) >= ring):
        return a
    if a is not None:
        n_tokens, logit_rows = max(n_tokens, a.n_tokens), max(logit_rows, a.logit_rows)
        ring = max(ring, len(a.tokens))
        a.close()
    return allocate(n_tokens, logit_rows, ring)
