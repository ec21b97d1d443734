"""`Op`: one specialized pipeline, called with tensors, a grid and push constants by name.

The push-constant layout comes from the reflected metadata (`push_constants`: each member's
name, offset, size and type), so a call site writes `op(x, w, y, grid=..., n_embd=576)` and
never packs bytes. What the shader declares is hard-checked at the call: the number of bound
tensors (`binding_count`), the dtype each binding takes (declared by the op's owner), every
push-constant member present and none extra, each value inside its type, and a grid inside
the device's `maxComputeWorkGroupCount`. Each failure is a `ShaderInterfaceError` naming the
module and the binding or member, with the numbers.

An op remembers the dispatches it made (up to `MEMO_SIZE`, then it starts over): a decode step
calls it with the same views, grid and values every token except for the few that carry the
position, and a remembered dispatch skips every check, the packing and its read/write sets.
"""
from __future__ import annotations

import struct

from vkrt.errors import ShaderInterfaceError
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.tensor import Tensor

MEMO_SIZE = 4096  # dispatches remembered per op

# struct codes per reflected scalar type; a bool push constant is a 32-bit VkBool32.
_CODES = {"bool": "I", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
          "float16": "e", "int32": "i", "uint32": "I", "float32": "f", "int64": "q",
          "uint64": "Q", "float64": "d"}


class Op:
    """`pipeline` (a `Pipeline`) callable as `op(*tensors, grid=(x, y, z), name=..., **push)`.

    Args:
        dtypes: per binding, the tensor dtype the shader reads it as (None: any).
    Raises (at construction): ShaderInterfaceError when a push-constant member is not a
        scalar (vectors, arrays, structs are not packable by name) or `dtypes` has the wrong
        length.
    """

    def __init__(self, pipeline, dtypes: tuple[str | None, ...] | None = None):
        self.pipeline, self.name = pipeline, pipeline.name
        meta = pipeline.meta
        self.binding_names = tuple(b.name for b in sorted(meta.bindings, key=lambda b: b.binding))
        self.dtypes = dtypes or (None,) * meta.binding_count
        if len(self.dtypes) != meta.binding_count:
            raise ShaderInterfaceError(f"{self.name}: {len(self.dtypes)} dtypes given for "
                                       f"{meta.binding_count} bindings")
        self._typed = [(i, d) for i, d in enumerate(self.dtypes) if d is not None]
        fmt, at = "<", 0
        for m in sorted(meta.push_constants, key=lambda m: m.offset):
            if m.type not in _CODES:
                raise ShaderInterfaceError(f"{self.name}: push constant {m.name!r} is a {m.type}; "
                                           f"only scalar members are packed by name")
            fmt += "x" * (m.offset - at) + _CODES[m.type]
            at = m.offset + m.size
        fmt += "x" * (meta.push_constant_size - at)
        self.push_names = tuple(m.name for m in sorted(meta.push_constants, key=lambda m: m.offset))
        self._types = {m.name: m.type for m in meta.push_constants}
        self._struct = struct.Struct(fmt)
        assert self._struct.size == meta.push_constant_size, (fmt, meta.push_constant_size)
        self._max_grid = pipeline.device.max_compute_work_group_count
        self._memo: dict[tuple, Dispatch] = {}

    def pack(self, push: dict) -> bytes:
        """The push-constant bytes of `push` ({member name: value}).

        Raises: ShaderInterfaceError for a missing or unknown member or a value its type
        cannot hold (module, member, type, value)."""
        try:
            if len(push) == len(self.push_names):
                return self._struct.pack(*[push[n] for n in self.push_names])
        except (KeyError, struct.error, OverflowError):
            pass
        missing = [n for n in self.push_names if n not in push]
        if missing:
            raise ShaderInterfaceError(f"{self.name}: push constant {missing[0]!r} not given; "
                                       f"declared: {', '.join(self.push_names) or 'none'}")
        extra = [n for n in push if n not in self._types]
        if extra:
            raise ShaderInterfaceError(f"{self.name}: no push constant {extra[0]!r}; "
                                       f"declared: {', '.join(self.push_names) or 'none'}")
        for n in self.push_names:
            try:
                struct.pack("<" + _CODES[self._types[n]], push[n])
            except (struct.error, OverflowError):
                raise ShaderInterfaceError(f"{self.name}: push constant {n!r} is "
                                           f"{self._types[n]}; cannot take {push[n]!r}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def __call__(self, *tensors: Tensor, grid: tuple[int, int, int], name: str = "",
                 need: tuple[int | None, ...] = (), **push) -> Dispatch:
        """A `Dispatch` of this op; nothing is recorded until a stream records it.

        Args:
            need: per binding, the elements the shader will touch (None: no check): the
                view must hold at least that many (`Tensor.size`: elements for every known
                dtype, GGUF block types included, so a q4_1 weight [n, k] holds n * k).
        Raises: ShaderInterfaceError (wrong tensor count or dtype, a view too small for
        `need`, push constants, a grid outside 1..maxComputeWorkGroupCount per dimension)."""
        # Tensors hash by identity (a view is immutable): a retyped or resized view of the
        # same bytes is another object, so it misses and is checked.
        key = (tensors, grid, tuple(push.items()), name)
        found = self._memo.get(key)
        if found is not None:
            return found
        self.check_tensors(tensors)
        for i, elements in enumerate(need):
            if elements is not None and tensors[i].size < elements:
                t = tensors[i]
                raise ShaderInterfaceError(
                    f"{self.name}: binding {i} ({self.binding_names[i]}) needs "
                    f"{elements} {t.dtype}, tensor {t.name!r} holds {t.size}")
        x, y, z = grid
        mx, my, mz = self._max_grid
        if not (0 < x <= mx and 0 < y <= my and 0 < z <= mz):
            raise ShaderInterfaceError(f"{self.name}: grid {tuple(grid)} outside the device's "
                                       f"maxComputeWorkGroupCount {self._max_grid}")
        found = Dispatch(self.pipeline, tensors, grid, self.pack(push), name or self.name)
        if len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
        self._memo[key] = found
        return found

    def check_tensors(self, tensors) -> None:
        """Raise ShaderInterfaceError unless one tensor per binding, each of the dtype the
        binding takes."""
        if len(tensors) != len(self.dtypes):
            raise ShaderInterfaceError(f"{self.name}: shader declares {len(self.dtypes)} storage "
                                       f"buffers, {len(tensors)} bound")
        for i, want in self._typed:
            t = tensors[i]
            if t.dtype != want:
                raise ShaderInterfaceError(
                    f"{self.name}: binding {i} ({self.binding_names[i]}) takes {want}, got "
                    f"{t.dtype} tensor {t.name!r}")
