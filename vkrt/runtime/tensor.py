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

from vkrt.errors import VkrtError


class Tensor:
    """`nbytes` bytes at byte `offset` of `buffer`, holding `dtype` elements of `shape`.

    Args:
        buffer: a `vkrt.runtime.memory.Buffer` (anything with `serial`, `nbytes`, `name`).
        offset, nbytes: the byte range, inside the buffer.
        dtype: a numpy dtype name (`"float32"`, `"uint32"`, ...); a GGUF block type later.
        shape: element shape, C order; for a numpy dtype, prod(shape) * itemsize == nbytes.
        name: shown in errors and dispatch names (default: the buffer's name).
    Attributes: `key` (serial, offset, nbytes, dtype): identity of the view for descriptor
        and dispatch caching;
        `range` (serial, start, end): the bytes the tracker records; `itemsize` (bytes per
        element, 0 for a dtype numpy does not know, e.g. a GGUF block type); `size` (elements).
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
        self.itemsize = itemsize = _itemsize(self.dtype)  # 0 for a non-numpy dtype
        self.size = self.nbytes // (itemsize or 1)           # elements (bytes if unknown)
        if itemsize and math.prod(self.shape) * itemsize != self.nbytes:
            raise VkrtError(f"tensor {self.name!r}: shape {self.shape} of {self.dtype} is "
                            f"{math.prod(self.shape) * itemsize} bytes, the view has {self.nbytes}")
        self.key = (buffer.serial, self.offset, self.nbytes, self.dtype)
        self.range = (buffer.serial, self.offset, self.offset + self.nbytes)

    @classmethod
    def of(cls, buffer, dtype: str = "uint8", shape: tuple[int, ...] | None = None,
           offset: int = 0, name: str = "") -> "Tensor":
        """A view from byte `offset` of `buffer`: of `shape` if given, else a 1-D view of
        every whole element up to the buffer's end."""
        itemsize = _itemsize(dtype) or 1
        if shape is None:
            shape = ((buffer.nbytes - offset) // itemsize,)
        return cls(buffer, offset, math.prod(shape) * itemsize, dtype, shape, name)

    def rows(self, start: int, stop: int, name: str = "") -> "Tensor":
        """Rows `start:stop` of the first dimension, as a view of the same buffer."""
        if not 0 <= start < stop <= self.shape[0]:
            raise VkrtError(f"tensor {self.name!r}: rows {start}:{stop} outside 0:{self.shape[0]}")
        row = self.nbytes // self.shape[0]
        return Tensor(self.buffer, self.offset + start * row, (stop - start) * row, self.dtype,
                      (stop - start, *self.shape[1:]), name or f"{self.name}[{start}:{stop}]")

    def __repr__(self) -> str:
        return (f"Tensor({self.name!r}, {self.dtype}{list(self.shape)}, "
                f"bytes {self.offset}..{self.offset + self.nbytes} of {self.buffer.name!r})")


def _itemsize(dtype: str) -> int:
    """Bytes per element of a numpy dtype name; 0 for a type numpy does not know."""
    try:
        return np.dtype(dtype).itemsize
    except TypeError:
        return 0
