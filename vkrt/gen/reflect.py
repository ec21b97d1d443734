"""Reflect a compute SPIR-V module: descriptors, spec constants, workgroup size, push constants.

A small parser of the SPIR-V binary (spec: https://registry.khronos.org/SPIR-V/specs/unified1/
SPIRV.html, "2.3 Physical Layout"); it never reads GLSL. Modules stored in either byte order
are read (2.3: the magic number 0x07230203 read as 0x03022307 means big-endian words), with
the same result but `sha256`: literal strings are decoded from the word values (2.2.1).
`reflect(spirv, module)` returns the dict stored per module in `modules.json` (see
`metadata.py`):

- `bindings`: one entry per distinct (set, binding): `set`, `binding`, `descriptor_type`
  (`storage_buffer`, `uniform_buffer`, `storage_image`, `sampled_image`, `sampler`,
  `combined_image_sampler`, `storage_texel_buffer`, `uniform_texel_buffer`), `count` (array
  length; 1 for a single descriptor, 0 for a runtime array), `writable`, `readable`, `names`
  (sorted block or variable names of every declaration aliased on that binding). Declared
  but unused descriptors are reported too: the descriptor set layout must hold them.
- `binding_count`: distinct binding numbers of storage buffers in set 0 (the runtime's set).
- `writable_mask`: bit b set when set-0 storage-buffer binding b is writable.
- `spec_ids`: `id`, `name` ("" when unnamed, e.g. glslang's local_size_x_id constant), `type`
  (`bool`, `int8/16/32/64`, `uint8/16/32/64`, `float16/32/64`), `default`; sorted by id, one
  entry per id. Only when constants sharing a SpecId disagree on their default (llama.cpp's
  `const uint BLOCK_SIZE = 32` with `local_size_x_id` on the same id: 32 and 1), the entry also
  has `defaults`: the distinct defaults, named constants' first ([32, 1]); `default` is the
  first. Unspecialized, each constant keeps its own default, so the runtime requires an
  explicit value for such a SpecId (`Pipeline._specialize`).
- `local_size`: [x, y, z] defaults, those of the constants the workgroup size is built from
  (1 for the idiom above, not 32); `local_size_spec_ids`: spec id or None per dimension.
- `push_constant_size`: bytes from offset 0 to the end of the push-constant block's last
  byte, rounded up to 4 (VkPushConstantRange.size must be a multiple of 4); 0 if none.
- `push_constants`: the block's top-level members in declaration order: `name` (the member
  name, or its index as a string when unnamed), `offset` and `size` in bytes, `type` (a scalar
  type name as for `spec_ids`, or `vector`, `matrix`, `array`, `struct`, `pointer`: a
  GL_EXT_buffer_reference pointer, PhysicalStorageBuffer, 8 bytes, also inside structs and
  arrays). The runtime packs push constants by these names (`vkrt/runtime/op.py`).
- `signed_zero_inf_nan_preserve` (only when declared): the float widths of the entry point's
  SignedZeroInfNanPreserve execution modes (SPIR-V 1.4 / SPV_KHR_float_controls), e.g. [32]:
  the module relies on IEEE infinities and NaNs, which the device must then preserve.
- `capabilities` (only when declared): the names of the module's OpCapability
  instructions but `Shader` (every compute module's), sorted (SPIR-V spec 3.31, e.g.
  `CooperativeMatrixKHR`, `Float16`, `GroupNonUniformArithmetic`, `VulkanMemoryModel`; one
  this table does not name as `capability N`): the runtime refuses a module declaring one
  its device lacks (`Pipeline._check_device`).
- `sha256`: hex digest of the module bytes.

Access rule (as SPIRV-Cross and SPIRV-Reflect): a buffer is read-only when the variable is
NonWritable or every member of its block is (glslang decorates members); write-only likewise
with NonReadable. An aliased binding is writable (readable) if any alias is. A uniform buffer
is never writable.

Refused with ReflectionError, one line naming the module, the binding, block, member, SpecId
or workgroup dimension, and the kind in words (`acceleration structure`, `array of arrays of
descriptors`, `pointer to Workgroup`, `a spec-constant operation (OpSpecConstantOp)`), never
an opcode: not SPIR-V; not exactly one entry point or one that is not GLCompute; decoration
groups; a descriptor without DescriptorSet or Binding; aliases that disagree on descriptor type
or count; an array of descriptors sized by a spec constant; an array of arrays of
descriptors; a descriptor kind not listed above (acceleration structures included); more than
one push-constant block; a push-constant member with spec-constant or runtime array length,
or a pointer that is not a PhysicalStorageBuffer one; a SpecId on constants of different
types; a workgroup size that is missing or computed (OpSpecConstantOp). A malformed module's
message may name a result id (`%N`, as `spirv-dis --raw-id` prints it) when nothing else
identifies the culprit.
"""
from __future__ import annotations

import hashlib
import struct
from collections import defaultdict

from vkrt.errors import ReflectionError

MAGIC = 0x07230203

# Opcodes (SPIR-V spec 3.52).
OP_NAME, OP_MEMBER_NAME, OP_ENTRY_POINT, OP_EXECUTION_MODE, OP_CAPABILITY = 5, 6, 15, 16, 17
OP_TYPE_BOOL, OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_VECTOR, OP_TYPE_MATRIX = 20, 21, 22, 23, 24
OP_TYPE_IMAGE, OP_TYPE_SAMPLER, OP_TYPE_SAMPLED_IMAGE = 25, 26, 27
OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY, OP_TYPE_STRUCT, OP_TYPE_POINTER = 28, 29, 30, 32
OP_TYPE_ACCELERATION_STRUCTURE = 5341
OP_CONSTANT_TRUE, OP_CONSTANT_FALSE, OP_CONSTANT, OP_CONSTANT_COMPOSITE = 41, 42, 43, 44
OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE, OP_SPEC_CONSTANT = 48, 49, 50
OP_SPEC_CONSTANT_COMPOSITE, OP_SPEC_CONSTANT_OP = 51, 52
OP_FUNCTION, OP_VARIABLE = 54, 59
OP_DECORATE, OP_MEMBER_DECORATE, OP_DECORATION_GROUP = 71, 72, 73
OP_EXECUTION_MODE_ID = 331
MODE_SIGNED_ZERO_INF_NAN_PRESERVE = 4461   # execution mode (SPIR-V spec 3.6)
# Capabilities by name (SPIR-V spec 3.31, the unified1 spirv.hpp numbers); `Shader` is left
# out of the metadata: every Vulkan compute module declares it.
CAPABILITY_SHADER = 1
_CAPABILITY_NAMES = {
    1: "Shader", 8: "Float16Buffer", 9: "Float16", 10: "Float64", 11: "Int64",
    12: "Int64Atomics", 22: "Int16", 30: "StorageBufferArrayDynamicIndexing", 39: "Int8",
    46: "SampledBuffer", 47: "ImageBuffer", 50: "ImageQuery", 61: "GroupNonUniform",
    62: "GroupNonUniformVote", 63: "GroupNonUniformArithmetic", 64: "GroupNonUniformBallot",
    65: "GroupNonUniformShuffle", 66: "GroupNonUniformShuffleRelative",
    67: "GroupNonUniformClustered", 68: "GroupNonUniformQuad",
    4433: "StorageBuffer16BitAccess", 4434: "UniformAndStorageBuffer16BitAccess",
    4435: "StoragePushConstant16", 4448: "StorageBuffer8BitAccess",
    4449: "UniformAndStorageBuffer8BitAccess", 4450: "StoragePushConstant8",
    4464: "DenormPreserve", 4465: "DenormFlushToZero", 4466: "SignedZeroInfNanPreserve",
    4467: "RoundingModeRTE", 4468: "RoundingModeRTZ", 5345: "VulkanMemoryModel",
    5301: "ShaderNonUniform", 5302: "RuntimeDescriptorArray",
    5308: "StorageBufferArrayNonUniformIndexing",
    5346: "VulkanMemoryModelDeviceScope", 5347: "PhysicalStorageBufferAddresses",
    5357: "CooperativeMatrixNV", 6016: "DotProductInputAllKHR",
    6017: "DotProductInput4x8BitKHR", 6018: "DotProductInput4x8BitPackedKHR",
    6019: "DotProductKHR", 6022: "CooperativeMatrixKHR",
    6026: "GroupNonUniformRotateKHR"}
# Type declarations (3.52.6) and what a message calls them. Types outside this table (ray
# queries, cooperative matrices, ...) never reach the interface that is reflected.
_TYPE_WORDS = {19: "void", 20: "bool", 21: "integer", 22: "float", 23: "vector", 24: "matrix",
               25: "image", 26: "sampler", 27: "sampled image", 28: "array",
               29: "runtime array", 30: "struct", 31: "opaque type", 32: "pointer",
               33: "function type", 39: "pointer", 5341: "acceleration structure"}
_TYPE_OPS = set(_TYPE_WORDS)
# Constant declarations (3.52.7) and what a message calls them.
_CONSTANT_WORDS = {41: "a boolean constant", 42: "a boolean constant", 43: "a literal constant",
                   44: "a composite constant", 46: "a null constant",
                   48: "a boolean spec constant", 49: "a boolean spec constant",
                   50: "a spec constant", 51: "a composite spec constant",
                   52: "a spec-constant operation (OpSpecConstantOp)"}
_CONSTANT_OPS = set(_CONSTANT_WORDS)

# Decorations (3.20), storage classes (3.7), execution model/modes (3.3, 3.6), builtins (3.21).
D_SPEC_ID, D_BLOCK, D_BUFFER_BLOCK, D_ROW_MAJOR = 1, 2, 3, 4
D_ARRAY_STRIDE, D_MATRIX_STRIDE, D_BUILTIN = 6, 7, 11
D_NON_WRITABLE, D_NON_READABLE, D_BINDING, D_DESCRIPTOR_SET, D_OFFSET = 24, 25, 33, 34, 35
SC_UNIFORM_CONSTANT, SC_UNIFORM, SC_PUSH_CONSTANT, SC_STORAGE_BUFFER = 0, 2, 9, 12
SC_PHYSICAL_STORAGE_BUFFER = 5349
_STORAGE_WORDS = {0: "UniformConstant", 1: "Input", 2: "Uniform", 3: "Output", 4: "Workgroup",
                  5: "CrossWorkgroup", 6: "Private", 7: "Function", 8: "Generic",
                  9: "PushConstant", 10: "AtomicCounter", 11: "Image", 12: "StorageBuffer",
                  5349: "PhysicalStorageBuffer"}
# A buffer_reference pointer: Addressing Model PhysicalStorageBuffer64 (3.4) makes pointers of
# storage class PhysicalStorageBuffer 64 bits wide.
POINTER_BYTES = 8
MODEL_GLCOMPUTE = 5
MODE_LOCAL_SIZE, MODE_LOCAL_SIZE_ID = 17, 38
BUILTIN_WORKGROUP_SIZE = 25
DIM_BUFFER, DIM_SUBPASS_DATA = 5, 6
_MODEL_NAMES = {0: "Vertex", 1: "TessellationControl", 2: "TessellationEvaluation",
                3: "Geometry", 4: "Fragment", 5: "GLCompute", 6: "Kernel", 5267: "TaskNV",
                5268: "MeshNV", 5313: "RayGenerationKHR", 5314: "IntersectionKHR",
                5315: "AnyHitKHR", 5316: "ClosestHitKHR", 5317: "MissKHR",
                5318: "CallableKHR", 5364: "TaskEXT", 5365: "MeshEXT"}


class _Module:
    """The tables of one parsed module, keyed by result id."""

    def __init__(self, spirv: bytes, module: str):
        self.module = module
        if len(spirv) < 20 or len(spirv) % 4:
            self.fail(f"not a SPIR-V module ({len(spirv)} bytes, not a whole header of words)")
        magic = struct.unpack_from("<I", spirv)[0]
        if magic == MAGIC:
            self.endian = "<"
        elif magic == struct.unpack(">I", struct.pack("<I", MAGIC))[0]:
            self.endian = ">"
        else:
            self.fail(f"not a SPIR-V module (magic 0x{magic:08x}, expected 0x{MAGIC:08x})")
        words = list(struct.unpack(f"{self.endian}{len(spirv) // 4}I", spirv))
        self.version = ((words[1] >> 16) & 0xFF, (words[1] >> 8) & 0xFF)
        self.names: dict[int, str] = {}
        self.member_names: dict[tuple[int, int], str] = {}
        # id -> decoration -> literals of each occurrence
        self.decorations: dict[int, dict[int, list[list[int]]]] = defaultdict(
            lambda: defaultdict(list))
        self.member_decorations: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(dict)
        self.entry_points: list[tuple[int, int, str]] = []
        self.modes: list[tuple[int, int, list[int]]] = []
        self.types: dict[int, tuple[int, list[int]]] = {}
        self.constants: dict[int, tuple[int, int, list[int]]] = {}
        self.variables: list[tuple[int, int, int]] = []
        self.capabilities: set[int] = set()
        pos = 5
        try:
            while pos < len(words):
                count, op = words[pos] >> 16, words[pos] & 0xFFFF
                if count == 0 or pos + count > len(words):
                    self.fail(f"malformed instruction at word {pos}: word count {count} "
                              f"(0, or past the module's {len(words)} words)")
                self._record(op, words[pos + 1:pos + count])
                if op == OP_FUNCTION:
                    break  # everything reflected is declared before the first function
                pos += count
        except (ValueError, IndexError) as e:
            self.fail(f"malformed instruction at word {pos}: {e}")

    def string(self, words: list[int]) -> tuple[str, int]:
        """Decode a nul-terminated literal string from word values; returns it and the number
        of words it used. Spec 2.2.1 (Literal): the UTF-8 octets are packed four per word, the
        first octet in the lowest-order 8 bits; so the bytes are the word values written
        little-endian, whatever the file's byte order (its words were swapped back on read)."""
        raw = struct.pack(f"<{len(words)}I", *words)
        end = raw.find(b"\0")
        if end < 0:
            raise ValueError("unterminated string")
        return raw[:end].decode("utf-8", "replace"), end // 4 + 1

    def fail(self, what: str):
        raise ReflectionError(f"{self.module}: {what}")

    def _record(self, op: int, a: list[int]) -> None:
        if op == OP_CAPABILITY:
            self.capabilities.add(a[0])
        elif op == OP_NAME:
            self.names[a[0]] = self.string(a[1:])[0]
        elif op == OP_MEMBER_NAME:
            self.member_names[(a[0], a[1])] = self.string(a[2:])[0]
        elif op == OP_ENTRY_POINT:
            self.entry_points.append((a[0], a[1], self.string(a[2:])[0]))
        elif op in (OP_EXECUTION_MODE, OP_EXECUTION_MODE_ID):
            self.modes.append((a[0], a[1], a[2:]))
        elif op == OP_DECORATE:
            self.decorations[a[0]][a[1]].append(a[2:])
        elif op == OP_MEMBER_DECORATE:
            self.member_decorations[(a[0], a[1])][a[2]] = a[3:]
        elif op == OP_DECORATION_GROUP:
            self.fail("decoration groups (OpDecorationGroup) are not supported")
        elif op in _TYPE_OPS:
            self.types[a[0]] = (op, a[1:])
        elif op in _CONSTANT_OPS:
            self.constants[a[1]] = (op, a[0], a[2:])
        elif op == OP_VARIABLE:
            self.variables.append((a[0], a[1], a[2]))

    # -- small queries -------------------------------------------------------------------
    def deco(self, id_: int, decoration: int) -> list[int] | None:
        """Literals of the first `decoration` on `id_`, or None when it is absent."""
        found = self.decorations.get(id_, {}).get(decoration)
        return found[0] if found else None

    def type(self, id_: int) -> tuple[int, list[int]]:
        if id_ not in self.types:
            # Only a malformed module (or a type unknown to _TYPE_WORDS) gets here; the
            # result id is then the only handle on it (spirv-dis --raw-id prints %<id>).
            self.fail(f"malformed module: %{id_} is used as a type but declares none known "
                      f"to the reflection")
        return self.types[id_]

    def type_words(self, type_id: int) -> str:
        """What a type is, in words: `uint32`, `vector of 4 float32`, `struct 'Push'`,
        `pointer to PhysicalStorageBuffer`, `acceleration structure`, ..."""
        op, a = self.type(type_id)
        if op in (OP_TYPE_BOOL, OP_TYPE_INT, OP_TYPE_FLOAT):
            return self.scalar_type(type_id, "")[0]
        if op == OP_TYPE_VECTOR:
            return f"vector of {a[1]} {self.type_words(a[0])}"
        if op in (OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY):
            return f"{_TYPE_WORDS[op]} of {self.type_words(a[0])}"
        if op == OP_TYPE_STRUCT:
            name = self.names.get(type_id)
            return f"struct {name!r}" if name else "struct"
        if op == OP_TYPE_POINTER:
            return f"pointer to {_STORAGE_WORDS.get(a[0], f'storage class {a[0]}')}"
        return _TYPE_WORDS[op]

    def scalar_type(self, type_id: int, where: str) -> tuple[str, int]:
        """`("int32", 32)`-style name and bit width of a scalar type; `where` names the use
        in the refusal of a non-scalar."""
        op, a = self.type(type_id)
        if op == OP_TYPE_BOOL:
            return "bool", 32
        if op == OP_TYPE_INT:
            return f"{'int' if a[1] else 'uint'}{a[0]}", a[0]
        if op == OP_TYPE_FLOAT:
            return f"float{a[0]}", a[0]
        self.fail(f"{where}: {self.type_words(type_id)} is not a scalar")

    def constant_words(self, const_id: int) -> str:
        """What a constant is, in words, with its name when it has one."""
        op = self.constants.get(const_id, (None,))[0]
        name = self.names.get(const_id)
        return _CONSTANT_WORDS.get(op, "not a constant") + (f" ({name})" if name else "")

    def scalar_value(self, const_id: int, where: str) -> int | float | bool:
        """The value (default, for a spec constant) of a scalar constant."""
        op, type_id, lits = self.constants.get(const_id, (None, None, None))
        if op in (OP_CONSTANT_TRUE, OP_SPEC_CONSTANT_TRUE):
            return True
        if op in (OP_CONSTANT_FALSE, OP_SPEC_CONSTANT_FALSE):
            return False
        if op not in (OP_CONSTANT, OP_SPEC_CONSTANT):
            self.fail(f"{where}: {self.constant_words(const_id)}, not a scalar")
        name, width = self.scalar_type(type_id, where)
        bits = lits[0] | (lits[1] << 32 if width == 64 else 0)
        bits &= (1 << width) - 1
        if name.startswith("float"):
            fmt = {16: "e", 32: "f", 64: "d"}[width]
            return struct.unpack(f"<{fmt}", bits.to_bytes(width // 8, "little"))[0]
        if name.startswith("int") and bits >> (width - 1):
            return bits - (1 << width)
        return bits

    def spec_id(self, const_id: int) -> int | None:
        lits = self.deco(const_id, D_SPEC_ID)
        return lits[0] if lits else None

    def array_length(self, length_id: int, where: str) -> int:
        op = self.constants.get(length_id, (None,))[0]
        if op != OP_CONSTANT:
            self.fail(f"{where}: array length is {self.constant_words(length_id)}; only a "
                      f"literal length is supported")
        return int(self.scalar_value(length_id, where))


# -- descriptors ---------------------------------------------------------------------------
def _all_members(m: _Module, struct_id: int, decoration: int) -> bool:
    n = len(m.type(struct_id)[1])
    return n > 0 and all(decoration in m.member_decorations.get((struct_id, i), {})
                         for i in range(n))


def _descriptor_label(m: _Module, var_id: int, type_id: int) -> str:
    """The variable's name, else its block's (glslang names an instance-less block's
    variable ""), else "unnamed": what a refusal calls the descriptor."""
    if m.names.get(var_id):
        return m.names[var_id]
    op, a = m.types.get(type_id, (None, [None, None]))
    inner = a[1] if op == OP_TYPE_POINTER else None
    while m.types.get(inner, (None,))[0] in (OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY):
        inner = m.types[inner][1][0]
    return m.names.get(inner) or "unnamed"


def _descriptor(m: _Module, var_id: int, storage: int, type_id: int) -> dict:
    """Describe one descriptor variable (one declaration; aliases are merged later)."""
    set_ = m.deco(var_id, D_DESCRIPTOR_SET)
    binding = m.deco(var_id, D_BINDING)
    label = _descriptor_label(m, var_id, type_id)
    if set_ is None or binding is None:
        m.fail(f"descriptor {label!r} lacks a DescriptorSet or Binding decoration")
    where = f"set {set_[0]} binding {binding[0]}"
    op, a = m.type(m.type(type_id)[1][1])  # the pointer's pointee
    count, elem = 1, m.type(type_id)[1][1]
    if op == OP_TYPE_ARRAY:
        count, elem = m.array_length(a[1], where), a[0]
    elif op == OP_TYPE_RUNTIME_ARRAY:
        count, elem = 0, a[0]
    op, a = m.type(elem)
    if op in (OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY):
        # Vulkan binds one-dimensional descriptor arrays only (VkDescriptorSetLayoutBinding
        # has one descriptorCount).
        m.fail(f"{where} ({label}): array of arrays of descriptors is not supported")
    non_writable = m.deco(var_id, D_NON_WRITABLE) is not None
    non_readable = m.deco(var_id, D_NON_READABLE) is not None
    name = m.names.get(var_id, "")
    if op == OP_TYPE_STRUCT:
        name = m.names.get(elem) or name
        block = m.deco(elem, D_BLOCK) is not None
        buffer_block = m.deco(elem, D_BUFFER_BLOCK) is not None
        if storage == SC_STORAGE_BUFFER and block or storage == SC_UNIFORM and buffer_block:
            kind = "storage_buffer"
        elif storage == SC_UNIFORM and block:
            kind = "uniform_buffer"
        else:
            m.fail(f"{where} ({label}): {m.type_words(elem)} in {_STORAGE_WORDS[storage]} "
                   f"storage without Block/BufferBlock is not a buffer")
        non_writable = non_writable or _all_members(m, elem, D_NON_WRITABLE)
        non_readable = non_readable or _all_members(m, elem, D_NON_READABLE)
        writable = kind == "storage_buffer" and not non_writable
    elif op == OP_TYPE_IMAGE and storage == SC_UNIFORM_CONSTANT:
        dim, sampled = a[1], a[5]
        if dim == DIM_SUBPASS_DATA:
            m.fail(f"{where}: input attachments are not supported in compute modules")
        if sampled == 2:
            kind = "storage_texel_buffer" if dim == DIM_BUFFER else "storage_image"
            writable = not non_writable
        else:
            kind = "uniform_texel_buffer" if dim == DIM_BUFFER else "sampled_image"
            writable = False
    elif op == OP_TYPE_SAMPLER and storage == SC_UNIFORM_CONSTANT:
        kind, writable = "sampler", False
    elif op == OP_TYPE_SAMPLED_IMAGE and storage == SC_UNIFORM_CONSTANT:
        # A GLSL samplerBuffer is a sampled image of Dim Buffer: a uniform texel buffer.
        buffer = m.type(a[0])[1][1] == DIM_BUFFER
        kind, writable = ("uniform_texel_buffer" if buffer else "combined_image_sampler"), False
    else:
        # An acceleration structure (GL_EXT_ray_query) lands here, like any other kind.
        m.fail(f"{where} ({label}): {m.type_words(elem)} in {_STORAGE_WORDS[storage]} storage "
               f"is not a supported descriptor")
    return {"set": set_[0], "binding": binding[0], "descriptor_type": kind, "count": count,
            "writable": writable, "readable": not non_readable, "names": [name]}


def _bindings(m: _Module) -> list[dict]:
    merged: dict[tuple[int, int], dict] = {}
    for type_id, var_id, storage in m.variables:
        if storage not in (SC_UNIFORM_CONSTANT, SC_UNIFORM, SC_STORAGE_BUFFER):
            continue
        d = _descriptor(m, var_id, storage, type_id)
        key = (d["set"], d["binding"])
        if key not in merged:
            merged[key] = d
            continue
        old = merged[key]
        for field in ("descriptor_type", "count"):
            if old[field] != d[field]:
                m.fail(f"set {key[0]} binding {key[1]}: aliased declarations disagree on "
                       f"{field} ({old[field]} vs {d[field]})")
        old["writable"] |= d["writable"]
        old["readable"] |= d["readable"]
        old["names"].append(d["names"][0])
    for d in merged.values():
        d["names"].sort()  # declaration order in the module follows first use: not stable
    return [merged[k] for k in sorted(merged)]


# -- spec constants, workgroup size --------------------------------------------------------
def _spec_constants(m: _Module) -> list[dict]:
    """One entry per SpecId. Vulkan gives every constant carrying a SpecId the one specialized
    value (spec 2.12 Specialization); unspecialized, each keeps its own default. They must agree
    on the type. When their defaults differ (llama.cpp's `layout(constant_id = 0) const uint
    BLOCK_SIZE = 32;` with `layout(local_size_x_id = 0) in;`: glslang emits SpecId 0 twice,
    defaults 32 and 1), the entry gets `defaults`, their distinct defaults: named constants'
    first, then module order (so [32, 1] whether glslang emits the workgroup's constant first,
    as for SPIR-V 1.6 LocalSizeId, or last); `default` is the first, the named constant's."""
    by_id: dict[int, dict] = {}
    named_first = sorted(m.constants.items(), key=lambda kv: not m.names.get(kv[0]))
    for const_id, (op, type_id, _) in named_first:
        sid = m.spec_id(const_id)
        if sid is None:
            continue
        where = f"SpecId {sid}"
        if op not in (OP_SPEC_CONSTANT, OP_SPEC_CONSTANT_TRUE, OP_SPEC_CONSTANT_FALSE):
            m.fail(f"{where} decorates {m.constant_words(const_id)}, not a scalar "
                   f"specialization constant")
        entry = {"id": sid, "name": m.names.get(const_id, ""),
                 "type": m.scalar_type(type_id, where)[0],
                 "default": m.scalar_value(const_id, where)}
        old = by_id.setdefault(sid, entry)
        if old["type"] != entry["type"]:
            m.fail(f"{where} is declared twice with different types ({old['type']} "
                   f"{old['name'] or '(unnamed)'} = {old['default']} vs {entry['type']} "
                   f"{entry['name'] or '(unnamed)'} = {entry['default']})")
        defaults = old.get("defaults", [old["default"]])
        if entry["default"] not in defaults:
            old["defaults"] = [*defaults, entry["default"]]
        old["name"] = old["name"] or entry["name"]
    return [by_id[k] for k in sorted(by_id)]


def _dimension(m: _Module, const_id: int, axis: str) -> tuple[int, int | None]:
    """(default value, spec id or None) of one workgroup-size component: the default of the
    constant the workgroup size is built from, not of another constant sharing its SpecId."""
    where = f"workgroup size {axis}"
    op = m.constants.get(const_id, (None,))[0]
    if op not in (OP_CONSTANT, OP_SPEC_CONSTANT):
        m.fail(f"{where} is {m.constant_words(const_id)}, not a literal or a specialization "
               f"constant")
    return (int(m.scalar_value(const_id, where)),
            m.spec_id(const_id) if op == OP_SPEC_CONSTANT else None)


def _local_size(m: _Module, entry_id: int) -> tuple[list[int], list[int | None]]:
    dims: list[tuple[int, int | None]] | None = None
    for target, mode, ops in m.modes:
        if target != entry_id:
            continue
        if mode == MODE_LOCAL_SIZE:
            dims = [(v, None) for v in ops[:3]]
        elif mode == MODE_LOCAL_SIZE_ID:
            dims = [_dimension(m, c, axis) for c, axis in zip(ops[:3], "xyz")]
    # Below SPIR-V 1.6 local_size_x_id is a constant decorated BuiltIn WorkgroupSize; it
    # overrides LocalSize (spec 3.21 WorkgroupSize).
    for const_id, (op, _, parts) in m.constants.items():
        builtin = m.deco(const_id, D_BUILTIN)
        if builtin and builtin[0] == BUILTIN_WORKGROUP_SIZE:
            if op not in (OP_CONSTANT_COMPOSITE, OP_SPEC_CONSTANT_COMPOSITE) or len(parts) != 3:
                m.fail("WorkgroupSize is not a composite of three constants")
            dims = [_dimension(m, c, axis) for c, axis in zip(parts, "xyz")]
    if dims is None:
        m.fail("no LocalSize, LocalSizeId or WorkgroupSize: workgroup size unknown")
    return [d[0] for d in dims], [d[1] for d in dims]


# -- push constants ------------------------------------------------------------------------
def _member_size(m: _Module, struct_id: int, index: int, type_id: int) -> int:
    op, a = m.type(type_id)
    where = (f"push constant {m.type_words(struct_id)} member "
             f"{m.member_names.get((struct_id, index), str(index))!r}")
    if op == OP_TYPE_POINTER:
        if a[0] != SC_PHYSICAL_STORAGE_BUFFER:
            m.fail(f"{where}: {m.type_words(type_id)} is not a buffer_reference "
                   f"(PhysicalStorageBuffer) pointer")
        return POINTER_BYTES
    if op == OP_TYPE_ARRAY:
        stride = m.deco(type_id, D_ARRAY_STRIDE)
        if stride is None:
            m.fail(f"{where}: array without ArrayStride")
        return m.array_length(a[1], where) * stride[0]
    if op == OP_TYPE_RUNTIME_ARRAY:
        m.fail(f"{where}: runtime array in a push-constant block")
    if op == OP_TYPE_STRUCT:
        return _struct_size(m, type_id)
    if op == OP_TYPE_MATRIX:
        rows = m.type(a[0])[1][1]
        decos = m.member_decorations.get((struct_id, index), {})
        if D_MATRIX_STRIDE not in decos:
            m.fail(f"{where}: matrix without MatrixStride")
        # Column-major: one stride per column; row-major: one per row.
        return decos[D_MATRIX_STRIDE][0] * (rows if D_ROW_MAJOR in decos else a[1])
    if op == OP_TYPE_VECTOR:
        return a[1] * m.scalar_type(a[0], where)[1] // 8
    return m.scalar_type(type_id, where)[1] // 8


def _struct_size(m: _Module, struct_id: int) -> int:
    end = 0
    for i, member_type in enumerate(m.type(struct_id)[1]):
        offset = m.member_decorations.get((struct_id, i), {}).get(D_OFFSET)
        if offset is None:
            m.fail(f"push constant {m.type_words(struct_id)} member "
                   f"{m.member_names.get((struct_id, i), str(i))!r} has no Offset")
        end = max(end, offset[0] + _member_size(m, struct_id, i, member_type))
    return end


_COMPOSITE_KINDS = {OP_TYPE_VECTOR: "vector", OP_TYPE_MATRIX: "matrix", OP_TYPE_ARRAY: "array",
                    OP_TYPE_STRUCT: "struct", OP_TYPE_POINTER: "pointer"}


def _push_constants(m: _Module) -> tuple[int, list[dict]]:
    """(push_constant_size, members) of the module's one push-constant block, or (0, [])."""
    blocks = [t for t, _, storage in m.variables if storage == SC_PUSH_CONSTANT]
    if len(blocks) > 1:
        m.fail(f"{len(blocks)} push-constant blocks; at most one is supported")
    if not blocks:
        return 0, []
    struct_id = m.type(blocks[0])[1][1]
    size = _struct_size(m, struct_id)  # refuses every member it cannot size, first
    members = []
    for i, member_type in enumerate(m.type(struct_id)[1]):
        op = m.type(member_type)[0]
        kind = _COMPOSITE_KINDS.get(op) or m.scalar_type(member_type, "push constant")[0]
        members.append({"name": m.member_names.get((struct_id, i), str(i)),
                        "offset": m.member_decorations[(struct_id, i)][D_OFFSET][0],
                        "size": _member_size(m, struct_id, i, member_type), "type": kind})
    return (size + 3) // 4 * 4, members


def _model_name(model: int) -> str:
    """An execution model (spec 3.3) by name."""
    return _MODEL_NAMES.get(model, f"execution model {model}")


# -- the entry point -----------------------------------------------------------------------
def reflect(spirv: bytes, module: str) -> dict:
    """Reflect one compute module; `module` names it in error messages.

    Returns the metadata dict described in this module's docstring (JSON-ready).

    Raises:
        ReflectionError: malformed SPIR-V, or a shape listed as refused in the docstring.
    """
    m = _Module(spirv, module)
    if len(m.entry_points) != 1:
        names = ", ".join(f"{_model_name(e[0])} {e[2]!r}" for e in m.entry_points)
        m.fail(f"{len(m.entry_points)} entry points ({names or 'none'}); exactly one "
               f"GLCompute entry point is supported")
    model, entry_id, entry_name = m.entry_points[0]
    if model != MODEL_GLCOMPUTE:
        m.fail(f"entry point {entry_name!r} is {_model_name(model)}, not GLCompute")
    bindings = _bindings(m)
    ssbo_set0 = [b for b in bindings if b["set"] == 0 and b["descriptor_type"] == "storage_buffer"]
    local_size, local_size_spec_ids = _local_size(m, entry_id)
    push_constant_size, push_constants = _push_constants(m)
    preserve = sorted({args[0] for eid, mode, args in m.modes
                       if eid == entry_id and mode == MODE_SIGNED_ZERO_INF_NAN_PRESERVE and args})
    optional = {"signed_zero_inf_nan_preserve": preserve} if preserve else {}
    capabilities = sorted(_CAPABILITY_NAMES.get(c, f"capability {c}")
                          for c in m.capabilities - {CAPABILITY_SHADER})
    if capabilities:
        optional["capabilities"] = capabilities
    return {**optional,
        "sha256": hashlib.sha256(spirv).hexdigest(),
        "binding_count": len(ssbo_set0),
        "writable_mask": sum(1 << b["binding"] for b in ssbo_set0 if b["writable"]),
        "bindings": bindings,
        "spec_ids": _spec_constants(m),
        "local_size": local_size,
        "local_size_spec_ids": local_size_spec_ids,
        "push_constant_size": push_constant_size,
        "push_constants": push_constants,
    }
