"""A step is data: the records a forward emits and a stream records, in order.

- `Dispatch`: one compute dispatch: a pipeline, the tensors bound to its bindings in order,
  the workgroup grid, the packed push-constant bytes and a human name (`blk.3.attn_q`).
- `Copy`: a transfer of `src`'s bytes into `dst` (staging uploads and readbacks).

Each record says what it reads and writes as byte ranges `(buffer serial, start, end)`,
computed once when the record is made: a dispatch from the bound views and the pipeline's
reflected `readable` / `writable` flags (NonWritable / NonReadable in the SPIR-V), a copy from
its source and destination. The barrier tracker (`barriers.py`) decides on those ranges alone,
so a list can be planned, counted and tested without a device.
"""
from __future__ import annotations

from vkrt.runtime.tensor import Tensor


class Dispatch:
    """`pipeline` over `grid` workgroups (x, y, z) with `tensors` bound to its bindings in
    order and `push` (bytes, the pipeline's `push_constant_size`) as its push constants.
    Build through an `Op` (`op.py`), which checks tensors and packs push constants by name.

    Attributes: the arguments, and `reads` / `writes`: byte ranges of the bindings the shader
    may read / write."""

    __slots__ = ("pipeline", "tensors", "grid", "push", "name", "reads", "writes", "push_c")
    transfer = False

    def __init__(self, pipeline, tensors: tuple[Tensor, ...], grid: tuple[int, int, int],
                 push: bytes, name: str):
        self.pipeline, self.tensors, self.grid, self.push, self.name = (
            pipeline, tuple(tensors), tuple(grid), push, name)
        self.reads = [t.range for t, r in zip(self.tensors, pipeline.readable) if r]
        self.writes = [t.range for t, w in zip(self.tensors, pipeline.writable) if w]
        self.push_c = None  # the stream's cffi view of `push`, made on first record

    def __repr__(self) -> str:
        return f"Dispatch({self.name!r}, {self.pipeline.name}, grid={self.grid})"


class Copy:
    """vkCmdCopyBuffer of `src.nbytes` bytes from `src` to `dst` (a transfer access)."""

    __slots__ = ("src", "dst", "name", "reads", "writes")
    transfer = True

    def __init__(self, src: Tensor, dst: Tensor, name: str = "copy"):
        self.src, self.dst, self.name = src, dst, name
        self.reads, self.writes = [src.range], [dst.range]

    def __repr__(self) -> str:
        return f"Copy({self.name!r}, {self.src!r} -> {self.dst!r})"
