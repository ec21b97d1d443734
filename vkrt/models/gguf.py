"""Reading a GGUF model file: metadata, tensor layout, weights as stored or as float32.

A model file is untrusted input. `load_gguf` walks the whole header itself with `struct`,
checking every count, length, shape, type and offset against the file's size while it decodes
the metadata (gguf-py's `GGUFReader` trusts the file: a corrupt count makes it loop or
allocate for a very long time; it also holds several numpy objects per vocabulary item,
~170 MB of host memory for SmolLM2's 49,152 tokens, and is not used). Whatever goes wrong
becomes a one-line `ModelFormatError` naming the file. Tensor data is read on demand with
file reads; block types are dequantized by gguf-py's `gguf.quants`.

Layout (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): a 24-byte header (magic
"GGUF", u32 version, u64 tensor count, u64 KV count), the KV pairs, the tensor infos (name,
u32 n_dims, u64 dims[n_dims] innermost first, u32 ggml type, u64 offset), padding to
`general.alignment`, then the tensor data.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, Keys
from gguf.quants import dequantize

from vkrt.errors import ModelFormatError

_HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_ELEMENTS = 1 << 40  # far above any real tensor; stops products that overflow or mean nothing
_MAX_NAME_BYTES = 1 << 16
_DEFAULT_ALIGNMENT = 32
# Fixed sizes of the scalar value types; STRING and ARRAY are handled apart.
_SCALAR_SIZE = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
# Every special-token id key gguf-py declares (gguf.Keys.Tokenizer: bos, eos, eot, eom, unknown,
# padding, fim_*, ...).
SPECIAL_TOKEN_KEYS = tuple(v for v in vars(Keys.Tokenizer).values()
                           if isinstance(v, str) and v.endswith("_token_id"))
# Arrays longer than this are returned as numpy arrays (token types, scores), not lists.
_LIST_MAX = 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where and how one tensor is stored.

    shape: numpy (row-major) order, outermost first: `blk.0.attn_q.weight` is (576, 576) =
    [n_out, n_in]; the file stores the reverse (ggml's ne[0] innermost first).
    ggml_type: the ggml type name, e.g. "Q4_1", "Q8_0", "F32", "F16".
    offset: absolute byte offset of the data in the file; nbytes: its size in bytes.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    offset: int
    nbytes: int


class _Cursor:
    """Bounds-checked little-endian reads from the mapped header."""

    def __init__(self, buf, size: int, path: str):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def fail(self, problem: str) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: {problem}")

    def take(self, nbytes: int, what: str) -> int:
        """Advance past nbytes; returns the old position."""
        if nbytes < 0 or self.pos + nbytes > self.size:
            raise self.fail(f"truncated at byte {self.pos} reading {what} "
                            f"({nbytes} bytes needed, file is {self.size} bytes)")
        pos = self.pos
        self.pos += nbytes
        return pos

    def unpack(self, fmt: str, what: str):
        s = struct.Struct("<" + fmt)
        return s.unpack_from(self.buf, self.take(s.size, what))

    def string(self, what: str, max_bytes: int | None = None) -> bytes:
        (n,) = self.unpack("Q", what + " length")
        if max_bytes is not None and n > max_bytes:
            raise self.fail(f"{what} is {n} bytes long (limit {max_bytes})")
        pos = self.take(n, what)
        return bytes(self.buf[pos:pos + n])


def _value_type(cur: _Cursor, raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.fail(f"{what} has unknown value type {raw}") from None


_MAX_NESTING = 8  # arrays of arrays deeper than this are refused (a crafted file could recurse)
_SCALAR_FMT = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}


def _array(cur: _Cursor, key: str, depth: int) -> list | np.ndarray:
    """Read one array value (its u32 item type, u64 count, items): a list of str for strings,
    nested lists for arrays of arrays (the GGUF spec allows them), else a list of numbers, or
    a numpy array (little-endian items copied) when the array is not nested and longer than
    `_LIST_MAX` items."""
    (raw_itype, count) = cur.unpack("IQ", f"array header of {key!r}")
    itype = _value_type(cur, raw_itype, f"array {key!r}")
    min_item = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}.get(itype) \
        or _SCALAR_SIZE[itype]
    if count * min_item > cur.size - cur.pos:
        raise cur.fail(f"array {key!r} claims {count} items, more than the "
                       f"{cur.size - cur.pos} bytes left in the file")
    if itype == GGUFValueType.ARRAY:
        if depth >= _MAX_NESTING:
            raise cur.fail(f"array {key!r} nests arrays more than {_MAX_NESTING} deep")
        return [_array(cur, key, depth + 1) for _ in range(count)]
    if itype == GGUFValueType.STRING:
        return [_utf8(cur, cur.string(f"item of {key!r}"), f"a string in array {key!r}")
                for _ in range(count)]
    pos = cur.take(count * min_item, f"array {key!r}")
    fmt = _SCALAR_FMT[itype]
    if depth == 0 and count > _LIST_MAX:
        return np.frombuffer(cur.buf, np.dtype("<" + fmt), count, pos).copy()
    return list(struct.unpack_from(f"<{count}{fmt}", cur.buf, pos))


def _utf8(cur: _Cursor, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise cur.fail(f"{what} is not UTF-8") from None


def _value(cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
    """Read one KV value: str, int, float, bool, or an array (`_array`)."""
    if vtype == GGUFValueType.STRING:
        return _utf8(cur, cur.string(f"value of {key!r}"), f"value of {key!r}")
    if vtype == GGUFValueType.ARRAY:
        return _array(cur, key, 0)
    pos = cur.take(_SCALAR_SIZE[vtype], f"value of {key!r}")
    return struct.unpack_from("<" + _SCALAR_FMT[vtype], cur.buf, pos)[0]


def _scan(buf, size: int, path: str) -> tuple[list[TensorInfo], dict[str, Any]]:
    """Validate and decode the header, KVs and tensor infos of a mapped GGUF; returns the
    tensor layout and the metadata (key -> value, see `GGUFFile.metadata`)."""
    cur = _Cursor(buf, size, path)
    magic, version, n_tensors, n_kv = cur.unpack("4sIQQ", "the 24-byte header")
    if magic != b"GGUF":
        raise cur.fail(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    if version & 0xFFFF == 0:
        raise cur.fail(f"big-endian GGUF (version field {version:#x}) is not supported")
    if version not in (2, 3):
        raise cur.fail(f"GGUF version {version} is not supported (expected 2 or 3)")
    # Smallest possible entries: a KV is key length + type + 1 byte; a tensor info is name
    # length + n_dims + one dim + type + offset.
    if n_kv * 13 + n_tensors * 32 > size - _HEADER.size:
        raise cur.fail(f"header claims {n_tensors} tensors and {n_kv} metadata keys, "
                       f"impossible in a {size}-byte file")

    alignment = _DEFAULT_ALIGNMENT
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = _utf8(cur, cur.string(f"key of metadata entry {i}", _MAX_NAME_BYTES),
                    f"key of metadata entry {i}")
        (raw,) = cur.unpack("I", f"type of {key!r}")
        vtype = _value_type(cur, raw, repr(key))
        if key in metadata:
            raise cur.fail(f"metadata key {key!r} appears twice")
        metadata[key] = _value(cur, vtype, key)
        if key == "general.alignment":
            if vtype != GGUFValueType.UINT32:
                raise cur.fail(f"general.alignment has type {vtype.name}, expected UINT32")
            alignment = metadata[key]
            if alignment == 0 or alignment & (alignment - 1):
                raise cur.fail(f"general.alignment is {alignment}, not a power of two")

    raw_infos = []
    for i in range(n_tensors):
        name = cur.string(f"name of tensor {i}", _MAX_NAME_BYTES).decode("utf-8", "replace")
        (n_dims,) = cur.unpack("I", f"n_dims of tensor {name!r}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dims (expected 1 to {_MAX_DIMS})")
        dims = cur.unpack(f"{n_dims}Q", f"dims of tensor {name!r}")
        raw_type, offset = cur.unpack("IQ", f"type and offset of tensor {name!r}")
        raw_infos.append((name, dims, raw_type, offset))
    data_start = -(-cur.pos // alignment) * alignment

    infos, names = [], set()
    for name, dims, raw_type, offset in raw_infos:
        if name in names:
            raise cur.fail(f"tensor {name!r} appears twice")
        names.add(name)
        try:
            gtype = GGMLQuantizationType(raw_type)
            block_size, type_size = GGML_QUANT_SIZES[gtype]
        except (ValueError, KeyError):
            raise cur.fail(f"tensor {name!r} has unknown ggml type {raw_type}") from None
        n_elements = 1
        for d in dims:
            if d < 1:
                raise cur.fail(f"tensor {name!r} has dims {list(dims)}: a dim is 0")
            n_elements *= d
            if n_elements > _MAX_ELEMENTS:
                raise cur.fail(f"tensor {name!r} has dims {list(dims)}: too many elements")
        shape = list(reversed(dims))
        if dims[0] % block_size:
            raise cur.fail(f"tensor {name!r} {shape} {gtype.name}: row length {dims[0]} is not "
                           f"a multiple of the {gtype.name} block size {block_size}")
        if offset % alignment:
            raise cur.fail(f"tensor {name!r}: offset {offset} is not aligned to {alignment}")
        nbytes = n_elements // block_size * type_size
        end = data_start + offset + nbytes
        if end > size:
            raise cur.fail(f"tensor {name!r} {shape} {gtype.name} is {nbytes} bytes "
                           f"({n_elements // block_size} blocks of {type_size}) and ends at byte "
                           f"{end}, past the end of the {size}-byte file (truncated or corrupt "
                           "offset)")
        infos.append(TensorInfo(name, tuple(shape), gtype.name, data_start + offset, nbytes))
    # A tensor's bytes (its type and shape) must end before the next tensor's begin: a size
    # that does not match the type and shape shows as an overlap.
    by_offset = sorted(infos, key=lambda t: t.offset)
    for a, b in zip(by_offset, by_offset[1:]):
        if a.offset + a.nbytes > b.offset:
            raise cur.fail(f"tensor {a.name!r} {list(a.shape)} {a.ggml_type} is {a.nbytes} "
                           f"bytes, but tensor {b.name!r} starts {b.offset - a.offset} bytes "
                           "after it (its size does not match its type and shape)")
    return infos, metadata


class GGUFFile:
    """A validated GGUF file. Use `load_gguf(path)` to open one.

    metadata: every KV pair, decoded: str, int, float, bool; arrays of strings as lists of str;
    numeric arrays as lists, or numpy arrays when longer than 1024 items; arrays of arrays
    as nested lists.
    Tensor data is read on demand with positioned file reads (nothing is memory-mapped):
    `tensor_f32` dequantizes one tensor per call, `tensor_raw` returns its stored bytes,
    `read_into` copies them into a buffer of the caller's (a mapped device buffer). `close()`
    releases the file descriptor those reads use.
    """

    def __init__(self, path: str, infos: list[TensorInfo], metadata: dict[str, Any]):
        self.path = path
        self._fd: int | None = None
        self._infos = {info.name: info for info in infos}
        self.metadata: dict[str, Any] = metadata

    @property
    def architecture(self) -> str:
        """`general.architecture`, e.g. "llama". ModelFormatError if missing."""
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError(f"{self.path}: no general.architecture in the metadata")
        return arch

    @property
    def tensor_names(self) -> list[str]:
        """Tensor names in file order, e.g. "token_embd.weight", "blk.0.attn_q.weight"."""
        return list(self._infos)

    def tensor_info(self, name: str) -> TensorInfo:
        """Shape (numpy order), ggml type name, offset and size of a tensor. KeyError if absent."""
        return self._infos[name]

    def tensor_f32(self, name: str) -> np.ndarray:
        """The tensor dequantized to a new float32 array in numpy row-major order (gguf-py's
        `gguf.quants.dequantize`).

        Shape is `tensor_info(name).shape`: a matrix is [rows, cols] as llama.cpp means it,
        `blk.0.attn_q.weight` [n_out=576, n_in=576], `token_embd.weight` [n_vocab, n_embd].
        Q and K keep llama.cpp's row order (convert_hf_to_gguf.py permutes their rows, so
        RoPE rotates adjacent pairs).
        Raises KeyError for an unknown name, ModelFormatError for a type gguf cannot dequantize.
        """
        info = self._infos[name]
        rows = int(np.prod(info.shape[:-1]))
        raw = self.tensor_raw(name).reshape(rows, -1)  # whole rows of blocks (checked at load)
        try:
            out = dequantize(raw, GGMLQuantizationType[info.ggml_type])
        except NotImplementedError:
            raise ModelFormatError(f"{self.path}: tensor {name!r} has type {info.ggml_type}, "
                                   "which cannot be dequantized") from None
        return np.ascontiguousarray(out, dtype=np.float32).reshape(info.shape)

    def tensor_raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored: a new read-only uint8 array of length `nbytes`."""
        out = np.empty(self._infos[name].nbytes, np.uint8)
        self.read_into(name, out)
        out.flags.writeable = False
        return out

    def read_into(self, name: str, out) -> None:
        """Copy the tensor's `nbytes` stored bytes into the start of `out` (any writable
        buffer: a numpy array, a mapped device buffer) with positioned file reads.
        Raises KeyError for an unknown name, ValueError when `out` is too small,
        ModelFormatError when the file is shorter than its header said (changed since it
        was opened)."""
        info = self._infos[name]
        view = memoryview(out).cast("B")[:info.nbytes]
        if len(view) < info.nbytes:
            raise ValueError(f"tensor {name!r}: {info.nbytes} bytes do not fit in {len(view)}")
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except OSError as e:
                raise ModelFormatError(f"{self.path}: cannot open: {e.strerror or e}") from None
        done = 0
        while done < info.nbytes:
            n = os.preadv(self._fd, [view[done:]], info.offset + done)
            if n <= 0:
                raise ModelFormatError(f"{self.path}: tensor {name!r} ends past the end of the "
                                       "file (changed since it was opened?)")
            done += n

    def close(self) -> None:
        """Close the file descriptor tensor reads use (a later read reopens it). Safe to call
        twice."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


def load_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file.

    Raises ModelFormatError (one line, naming the file) when the file is missing, truncated,
    corrupt, or uses a feature the reader cannot handle. Weights are not read.
    """
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except FileNotFoundError:
        raise ModelFormatError(f"model file not found: {path}") from None
    except OSError as e:
        raise ModelFormatError(f"{path}: cannot open: {e.strerror or e}") from None
    with f:
        if size < _HEADER.size:
            raise ModelFormatError(f"{path}: truncated: {size} bytes, shorter than the "
                                   f"{_HEADER.size}-byte GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            infos, metadata = _scan(buf, size, path)
    return GGUFFile(path, infos, metadata)
