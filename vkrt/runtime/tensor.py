"""`Tensor`: a typed view of a byte range of one buffer; what a dispatch binds.

Several tensors may live in one buffer (the activations of a forward, the KV cache of every
layer), disjoint or overlapping. The barrier tracker (`barriers.py`) keys accesses on a view's
byte range `(buffer serial, start, end)`, so dispatches on disjoint views of one buffer need
no barrier between them. A descriptor binds exactly the view's offset and range
(`pipeline.py`), which is why the offset must respect the device's
`minStorageBufferOffsetAlignment` (Vulkan spec, VUID-VkWriteDescriptorSet-descriptorType-00328);
that is checked where it is bound.

No Vulkan here: a tensor only needs its buffer's `serial`, `nbytes` and `name`, so dispatch
lists can be built and their barriers planned without a device.
"""
from __future__ import annotations

import math

import numpy as np

from vkrt import weight_types as _weight_types
from vkrt.errors import VkrtError


class Tensor:
    """`nbytes` bytes at byte `offset` of `buffer`, holding `dtype` elements of `shape`.

    Args:
        buffer: a `vkrt.runtime.memory.Buffer` (anything with `serial`, `nbytes`, `name`).
        offset, nbytes: the byte range, inside the buffer.
        dtype: a numpy dtype name (`"float32"`, `"uint32"`, `"float16"`, ...), `"bfloat16"`,
            or a GGUF block type the kernels read (`"q8_0"`, `"q4_k"`, ..., see `BLOCKS`).
        shape: element shape, C order; for a known dtype nbytes == nbytes_of(dtype, shape).
        name: shown in errors and dispatch names (default: the buffer's name).
    Attributes: `key` (serial, offset, nbytes, dtype): identity of the view for descriptor
        and dispatch caching;
        `range` (serial, start, end): the bytes the tracker records; `itemsize` (bytes per
        element, 0 for a block type or a dtype not known here); `size` (elements for every
        known dtype, block types included: what `Op`'s `need=` counts; bytes otherwise).
    Raises: VkrtError when the range is empty, negative or past the buffer's end, or the
        shape does not match `nbytes`, with the numbers.
    """

    __slots__ = ("buffer", "offset", "nbytes", "dtype", "shape", "name", "key", "range",
                 "itemsize", "size")

    def __init__(self, buffer, offset: int, nbytes: int, dtype: str, shape: tuple[int, ...],
                 name: str = ""):
        self.buffer, self.offset, self.nbytes = buffer, int(offset), int(nbytes)
        self.dtype, self.shape = str(dtype), tuple(int(d) for d in shape)
        self.name = name or buffer.name
        if self.offset < 0 or self.nbytes <= 0 or self.offset + self.nbytes > buffer.nbytes:
            raise VkrtError(f"tensor {self.name!r}: bytes {self.offset}..{self.offset + self.nbytes}"
                            f" do not lie inside buffer {buffer.name!r} of {buffer.nbytes} bytes")
        self.itemsize = itemsize = _itemsize(self.dtype)  # 0 for a block or unknown dtype
        if itemsize or self.dtype in BLOCKS:
            self.size = math.prod(self.shape)             # elements
            want = nbytes_of(self.dtype, self.shape, self.name)
            if want != self.nbytes:
                raise VkrtError(f"tensor {self.name!r}: shape {self.shape} of {self.dtype} is "
                                f"{want} bytes, the view has {self.nbytes}")
        else:
            self.size = self.nbytes                       # bytes of an unknown dtype
        self.key = (buffer.serial, self.offset, self.nbytes, self.dtype)
        self.range = (buffer.serial, self.offset, self.offset + self.nbytes)

    @classmethod
    def of(cls, buffer, dtype: str = "uint8", shape: tuple[int, ...] | None = None,
           offset: int = 0, name: str = "") -> "Tensor":
        """A view from byte `offset` of `buffer`: of `shape` if given, else a 1-D view of
        every whole element up to the buffer's end."""
        if shape is None:
            shape = ((buffer.nbytes - offset) // (_itemsize(dtype) or 1),)
        nbytes = (nbytes_of(dtype, shape, name) if _itemsize(dtype) or dtype in BLOCKS
                  else math.prod(shape))
        return cls(buffer, offset, nbytes, dtype, shape, name)

    def rows(self, start: int, stop: int, name: str = "") -> "Tensor":
        """Rows `start:stop` of the first dimension, as a view of the same buffer."""
        if not 0 <= start < stop <= self.shape[0]:
            raise VkrtError(f"tensor {self.name!r}: rows {start}:{stop} outside 0:{self.shape[0]}")
        row = self.nbytes // self.shape[0]
        if self.dtype in BLOCKS and row * self.shape[0] != self.nbytes:
            raise VkrtError(f"tensor {self.name!r}: rows of {self.dtype} {self.shape} are not "
                            "whole 32-bit words")
        return Tensor(self.buffer, self.offset + start * row, (stop - start) * row, self.dtype,
                      (stop - start, *self.shape[1:]), name or f"{self.name}[{start}:{stop}]")

    def __repr__(self) -> str:
        return (f"Tensor({self.name!r}, {self.dtype}{list(self.shape)}, "
                f"bytes {self.offset}..{self.offset + self.nbytes} of {self.buffer.name!r})")


# GGUF block types the kernels read as stored: dtype -> (elements, bytes) per block, from the
# type table (vkrt/weight_types.py TYPES).
BLOCKS = _weight_types.BLOCKS
_ITEMSIZE = {"bfloat16": 2}  # numpy has no bfloat16


def nbytes_of(dtype: str, shape: tuple[int, ...], name: str = "") -> int:
    """Bytes of a tensor of `shape` and `dtype`: prod(shape) * itemsize, or for a block type
    the bytes of its blocks rounded up to a multiple of 4 (the shaders read blocks as 32-bit
    words, and a Q8_0 block is 34 bytes, a Q6_K block 210). Raises VkrtError when the last dimension of a
    block type is not a multiple of its block's elements."""
    n = math.prod(shape)
    if dtype in BLOCKS:
        k, b = BLOCKS[dtype]
        if not shape or shape[-1] % k:
            raise VkrtError(f"tensor {name!r}: {dtype} rows of {shape[-1] if shape else 0} "
                            f"elements are not whole blocks of {k}")
        return -(-(n // k * b) // 4) * 4
    return n * _itemsize(dtype)


def _itemsize(dtype: str) -> int:
    """Bytes per element of a numpy dtype name or bfloat16; 0 for a block type or a type
    not known here."""
    if dtype in _ITEMSIZE:
        return _ITEMSIZE[dtype]
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 0
