"""A step is data: the records a forward emits and a stream records, in order.

- `Dispatch`: one compute dispatch: a pipeline, the tensors bound to its bindings in order,
  the workgroup grid, the packed push-constant bytes and a human name (`blk.3.attn_q`).
- `Copy`: a transfer of `src`'s bytes into `dst` (staging uploads and readbacks).

Each record says what it reads and writes as byte ranges `(buffer serial, start, end)`: a
dispatch from the bound views and the pipeline's reflected `readable` / `writable` flags
(NonWritable / NonReadable in the SPIR-V), a copy from its source and destination. The barrier
tracker (`barriers.py`) decides on those ranges alone, so a list can be planned, counted and
tested without a device.
"""
from __future__ import annotations

from typing import NamedTuple

from vkrt.runtime.tensor import Tensor


class Dispatch(NamedTuple):
    """`pipeline` over `grid` workgroups (x, y, z) with `tensors` bound to its bindings in
    order and `push` (bytes, the pipeline's `push_constant_size`) as its push constants.
    Build through an `Op` (`op.py`), which checks tensors and packs push constants by name."""
    pipeline: object
    tensors: tuple[Tensor, ...]
    grid: tuple[int, int, int]
    push: bytes
    name: str

    transfer = False

    def accesses(self) -> tuple[list, list]:
        """(reads, writes): byte ranges of the bindings the shader may read / write."""
        p = self.pipeline
        return ([t.range for t, r in zip(self.tensors, p.readable) if r],
                [t.range for t, w in zip(self.tensors, p.writable) if w])


class Copy(NamedTuple):
    """vkCmdCopyBuffer of `src.nbytes` bytes from `src` to `dst` (a transfer access)."""
    src: Tensor
    dst: Tensor
    name: str = "copy"

    transfer = True

    def accesses(self) -> tuple[list, list]:
        return [self.src.range], [self.dst.range]
