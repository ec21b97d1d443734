"""Compute pipelines built from the committed SPIR-V and its reflected metadata.

`PipelineCache.get_pipeline(name, spec)` builds (once per name and specialization) the shader
module, the descriptor-set layout (one storage buffer per reflected binding), the pipeline
layout (one push-constant range of the reflected size) and the compute pipeline. What the host
binds is hard-checked against what the shader declares by the `Op` that calls it (`op.py`);
`Pipeline.bind` checks each bound view against the device's limits and caches one descriptor
set per distinct tuple of views.
"""
from __future__ import annotations

import struct
from pathlib import Path
from vkrt.errors import ShaderInterfaceError, VkrtError
from vkrt.gen.metadata import DEFAULT_SPIRV_DIR, ModuleMeta, load_modules, read_spirv
from vkrt.runtime.device import Device
from vkrt.runtime.vk import NULL, check, ffi, lib, new, vk

# Specialization data layout per reflected scalar type: a bool is a VkBool32 (Vulkan spec
# 10.9 "Specialization Constants": "the size of a boolean ... is the size of VkBool32").
_SPEC_FORMAT = {"bool": "<I", "int8": "<b", "uint8": "<B", "int16": "<h", "uint16": "<H",
                "float16": "<e", "int32": "<i", "uint32": "<I", "float32": "<f",
                "int64": "<q", "uint64": "<Q", "float64": "<d"}
SETS_PER_POOL = 256
# VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR (VK_KHR_pipeline_executable_properties).
CAPTURE_STATISTICS = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR
# VkPipelineExecutableStatisticFormatKHR -> the VkPipelineExecutableStatisticValueKHR member.
_STATISTIC_VALUE = {
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: lambda v: bool(v.b32),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: lambda v: int(v.i64),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: lambda v: int(v.u64),
    vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: lambda v: float(v.f64)}
# SPIR-V capabilities a module may declare (reflected into `ModuleMeta.capabilities`) -> the
# `Device.features` entry without which the device cannot run it (Vulkan spec, appendix
# "SPIR-V Environment", "Capabilities": e.g. CooperativeMatrixKHR needs
# VkPhysicalDeviceCooperativeMatrixFeaturesKHR::cooperativeMatrix, Float16 shaderFloat16,
# VulkanMemoryModel vulkanMemoryModel). Capabilities not listed here are either required of
# every device at creation (the subgroup operations: device.py) or left to the driver.
CAPABILITY_FEATURES = {
    "CooperativeMatrixKHR": "cooperativeMatrix", "Float16": "shaderFloat16",
    "DotProductKHR": "shaderIntegerDotProduct",
    "DotProductInput4x8BitPackedKHR": "shaderIntegerDotProduct",
    "Int8": "shaderInt8", "StorageBuffer16BitAccess": "storageBuffer16BitAccess",
    "StorageBuffer8BitAccess": "storageBuffer8BitAccess",
    "VulkanMemoryModel": "vulkanMemoryModel"}


class Pipeline:
    """One specialized compute pipeline.

    Attributes: `name`, `meta` (ModuleMeta), `local_size` (x, y, z after specialization),
    `binding_numbers` (sorted), `writable` / `readable` (tuple of bool per binding in that
    order, from the reflected NonWritable / NonReadable decorations), `push_constant_size`
    (bytes), `handle`, `layout`.
    """

    def __init__(self, device: Device, meta: ModuleMeta, spirv: bytes, spec: dict):
        self.device, self.meta, self.name = device, meta, meta.name
        self.handle = self.layout = self.set_layout = self.module = None
        self._pools: list = []
        self._sets: dict[tuple, object] = {}
        self._free_in_pool = 0
        try:
            self._build(spirv, spec)
        except BaseException:
            self.close()
            raise
        device.adopt(self)

    def _build(self, spirv: bytes, spec: dict) -> None:
        meta, dev = self.meta, self.device
        for b in meta.bindings:
            if b.set != 0 or b.descriptor_type != "storage_buffer":
                raise ShaderInterfaceError(
                    f"{meta.name}: binding (set {b.set}, binding {b.binding}) is a "
                    f"{b.descriptor_type}; the runtime binds storage buffers in set 0 only")
        self.binding_numbers = tuple(sorted({b.binding for b in meta.bindings}))
        assert len(self.binding_numbers) == meta.binding_count
        self.writable = tuple(bool(meta.writable_mask >> n & 1) for n in self.binding_numbers)
        readable = {b.binding: b.readable for b in meta.bindings}
        self.readable = tuple(readable[n] for n in self.binding_numbers)
        self.push_constant_size = meta.push_constant_size
        if self.push_constant_size > dev.max_push_constants_size:
            raise ShaderInterfaceError(
                f"{meta.name}: push constants of {self.push_constant_size} bytes exceed the "
                f"device's maxPushConstantsSize {dev.max_push_constants_size}")
        values = self._specialize(spec)
        self._check_capabilities(dev)

        code = new("uint32_t[]", len(spirv) // 4)
        ffi.memmove(code, spirv, len(spirv))
        info = new("VkShaderModuleCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
            "codeSize": len(spirv), "pCode": code})
        out = new("VkShaderModule*")
        check(lib.vkCreateShaderModule(dev.handle, info, NULL, out), f"{meta.name}: shader module")
        self.module = out[0]

        n = meta.binding_count
        layout_bindings = new("VkDescriptorSetLayoutBinding[]", [
            {"binding": b, "descriptorType": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
             "descriptorCount": 1, "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT}
            for b in self.binding_numbers] or 1)
        info = new("VkDescriptorSetLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
            "bindingCount": n, "pBindings": layout_bindings})
        out = new("VkDescriptorSetLayout*")
        check(lib.vkCreateDescriptorSetLayout(dev.handle, info, NULL, out), "set layout")
        self.set_layout = out[0]
        self._set_layout_ptr = new("VkDescriptorSetLayout[1]", [self.set_layout])

        push_range = new("VkPushConstantRange*", {
            "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT, "offset": 0,
            "size": self.push_constant_size})
        info = new("VkPipelineLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
            "setLayoutCount": 1, "pSetLayouts": self._set_layout_ptr,
            "pushConstantRangeCount": 1 if self.push_constant_size else 0,
            "pPushConstantRanges": push_range})
        out = new("VkPipelineLayout*")
        check(lib.vkCreatePipelineLayout(dev.handle, info, NULL, out), "pipeline layout")
        self.layout = out[0]

        entries, data = [], b""
        for sc, value in values:
            fmt = _SPEC_FORMAT[sc.type]
            entries.append({"constantID": sc.id, "offset": len(data), "size": struct.calcsize(fmt)})
            try:
                data += struct.pack(fmt, value)
            except struct.error:
                raise ShaderInterfaceError(
                    f"{meta.name}: specialization constant {sc.name or sc.id} is {sc.type}; "
                    f"cannot take {value!r}") from None
        self._check_device(dev)   # after the values are known to fit their types
        map_entries = new("VkSpecializationMapEntry[]", entries or 1)
        spec_data = new("char[]", data or b"\0")
        spec_info = new("VkSpecializationInfo*", {
            "mapEntryCount": len(entries), "pMapEntries": map_entries,
            "dataSize": len(data), "pData": spec_data})
        main = new("char[]", b"main")
        info = new("VkComputePipelineCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
            "flags": CAPTURE_STATISTICS if dev.features.get("pipelineExecutableInfo") else 0,
            "stage": {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      "stage": vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": self.module,
                      "pName": main, "pSpecializationInfo": spec_info},
            "layout": self.layout})
        out = new("VkPipeline*")
        check(lib.vkCreateComputePipelines(dev.handle, NULL, 1, info, NULL, out),
              f"{meta.name}: vkCreateComputePipelines")
        self.handle = out[0]

    def _check_device(self, dev: Device) -> None:
        """Refuse, before the pipeline is made, a specialized workgroup past the
        device's maxComputeWorkGroupSize / maxComputeWorkGroupInvocations (e.g. attention's
        one invocation per head dimension), and a module declaring SignedZeroInfNanPreserve
        (it relies on IEEE infinities) for a float width the device does not preserve
        (shaderSignedZeroInfNanPreserveFloat16/32/64; Vulkan spec, "Float Controls").
        Capabilities are checked before the shader module is made (`_check_capabilities`).

        Raises: ShaderInterfaceError, one line naming the module and the numbers."""
        size, lim = self.local_size, dev.limits
        most = tuple(lim.maxComputeWorkGroupSize)
        total = size[0] * size[1] * size[2]
        if any(s > m for s, m in zip(size, most)) or total > lim.maxComputeWorkGroupInvocations:
            raise ShaderInterfaceError(
                f"{self.name}: workgroup {size[0]}x{size[1]}x{size[2]} ({total} invocations) "
                f"is past {dev.name}'s maxComputeWorkGroupSize {most[0]}x{most[1]}x{most[2]} "
                f"or maxComputeWorkGroupInvocations {lim.maxComputeWorkGroupInvocations}")
        for bits in self.meta.signed_zero_inf_nan_preserve:
            if not dev.inf_nan_preserve.get(bits):
                raise ShaderInterfaceError(
                    f"{self.name}: keeps IEEE infinities and NaNs of {bits}-bit floats "
                    f"(SignedZeroInfNanPreserve), which {dev.name} does not support "
                    f"(shaderSignedZeroInfNanPreserveFloat{bits})")

    def _check_capabilities(self, dev: Device) -> None:
        """Refuse a module that declares a SPIR-V capability (reflected, `meta.capabilities`)
        whose device feature `dev` has not enabled (CAPABILITY_FEATURES: CooperativeMatrixKHR
        without VK_KHR_cooperative_matrix, Float16 without shaderFloat16, ...), before
        vkCreateShaderModule sees it (Vulkan spec, appendix "SPIR-V Environment",
        "Capabilities": each capability a module declares must be enabled on the device).

        Raises: ShaderInterfaceError, one line naming the module, capability and feature."""
        for cap in self.meta.capabilities:
            feature = CAPABILITY_FEATURES.get(cap)
            if feature is not None and not dev.features.get(feature):
                raise ShaderInterfaceError(
                    f"{self.name}: declares the SPIR-V capability {cap}, which {dev.name} "
                    f"does not support (device feature {feature})")

    def _specialize(self, spec: dict) -> list:
        """Resolve `spec` (keys: constant name or id) against the reflected constants and
        compute the specialized workgroup size.

        Returns: [(SpecConstant, value)] of the constants given, sorted by SpecId.
        Raises: ShaderInterfaceError on an unknown key, or when a SpecId whose constants have
        different defaults (`SpecConstant.defaults`, e.g. llama.cpp's BLOCK_SIZE = 32 sharing
        SpecId 0 with local_size_x_id, default 1) is not given: unspecialized, the shader's
        BLOCK_SIZE and its workgroup width would differ."""
        by_key = {}
        for sc in self.meta.spec_constants:
            by_key[sc.id] = sc
            if sc.name:
                by_key[sc.name] = sc
        chosen = {}
        for key, value in spec.items():
            if key not in by_key:
                declared = ", ".join(f"{sc.name or '?'}={sc.id}" for sc in self.meta.spec_constants)
                raise ShaderInterfaceError(
                    f"{self.name}: no specialization constant {key!r}; declared: {declared or 'none'}")
            chosen[by_key[key].id] = (by_key[key], value)
        self.spec = {sc.id: v for sc, v in chosen.values()}
        for sc in self.meta.spec_constants:
            if sc.defaults and sc.id not in self.spec:
                dims = [f"workgroup size {axis}"
                        for axis, sid in zip("xyz", self.meta.local_size_spec_ids) if sid == sc.id]
                raise ShaderInterfaceError(
                    f"{self.name}: SpecId {sc.id} ({sc.name or 'unnamed'}"
                    f"{''.join(', ' + d for d in dims)}) has defaults "
                    f"{' and '.join(map(str, sc.defaults))}; specialize it explicitly, e.g. "
                    f"get_pipeline({self.name!r}, {{{sc.id}: {sc.defaults[0]!r}}})")
        # Unspecialized, a dimension keeps the default of the constant it is built from: the
        # reflected local_size (1 for the idiom above, whatever BLOCK_SIZE's default).
        self.local_size = tuple(
            self.spec.get(sid, size) if sid is not None else size
            for size, sid in zip(self.meta.local_size, self.meta.local_size_spec_ids))
        return sorted(chosen.values(), key=lambda p: p[0].id)

    def statistics(self) -> dict[str, int | float | bool]:
        """What the driver reports of the code it compiled for this pipeline
        (vkGetPipelineExecutableStatisticsKHR of its one executable; names and meanings are
        the driver's, e.g. NVIDIA's "Register Count"), by statistic name.

        Raises:
            VkrtError: the device was not opened with `Device(pipeline_statistics=True)`."""
        dev = self.device
        if not dev.features.get("pipelineExecutableInfo"):
            raise VkrtError(f"{self.name}: pipeline statistics need "
                            f"Device(pipeline_statistics=True)")
        get = vk.vkGetDeviceProcAddr(dev.handle, "vkGetPipelineExecutableStatisticsKHR")
        info = new("VkPipelineExecutableInfoKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
            "pipeline": self.handle, "executableIndex": 0})
        stats = get(dev.handle, info)
        # The binding's wrapper runs the two-call idiom and gives each name as a str.
        return {str(st.name): _STATISTIC_VALUE[st.format](st.value) for st in stats}

    def bind(self, tensors, counters=None):
        """The descriptor set (a `VkDescriptorSet[1]`) binding each view of `tensors` (its
        buffer, offset and range) to the bindings in order. Written once per distinct tuple of
        views and reused: a decode step binds the same views every token. A write is counted
        in `counters.descriptor_sets`.

        Raises: ShaderInterfaceError when a view's range exceeds maxStorageBufferRange or its
        offset is not a multiple of minStorageBufferOffsetAlignment (Vulkan spec,
        VUID-VkWriteDescriptorSet-descriptorType-00328).
        """
        key = tuple([t.key for t in tensors])
        found = self._sets.get(key)
        if found is not None:
            return found
        align = self.device.min_storage_buffer_offset_alignment
        limit = self.device.max_storage_buffer_range
        for i, t in enumerate(tensors):
            if t.nbytes > limit:
                raise ShaderInterfaceError(
                    f"{self.name}: binding {self.binding_numbers[i]} tensor {t.name!r} of "
                    f"{t.nbytes} bytes exceeds the device's maxStorageBufferRange {limit}")
            if t.offset % align:
                raise ShaderInterfaceError(
                    f"{self.name}: binding {self.binding_numbers[i]} tensor {t.name!r} at byte "
                    f"offset {t.offset}, not a multiple of the device's "
                    f"minStorageBufferOffsetAlignment {align}")
        if self._free_in_pool == 0:
            self._grow_pool()
        alloc = new("VkDescriptorSetAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
            "descriptorPool": self._pools[-1], "descriptorSetCount": 1,
            "pSetLayouts": self._set_layout_ptr})
        out = new("VkDescriptorSet[1]")
        check(lib.vkAllocateDescriptorSets(self.device.handle, alloc, out), "descriptor set")
        self._free_in_pool -= 1
        if tensors:
            infos = new("VkDescriptorBufferInfo[]", [
                {"buffer": t.buffer.handle, "offset": t.offset, "range": t.nbytes}
                for t in tensors])
            writes = new("VkWriteDescriptorSet[]", [
                {"sType": vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, "dstSet": out[0],
                 "dstBinding": n, "descriptorCount": 1,
                 "descriptorType": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, "pBufferInfo": infos + i}
                for i, n in enumerate(self.binding_numbers)])
            lib.vkUpdateDescriptorSets(self.device.handle, len(tensors), writes, 0, NULL)
        if counters is not None:
            counters.descriptor_sets += 1
        self._sets[key] = out
        return out

    def _grow_pool(self) -> None:
        size = new("VkDescriptorPoolSize*", {
            "type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            "descriptorCount": SETS_PER_POOL * max(1, self.meta.binding_count)})
        info = new("VkDescriptorPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
            "maxSets": SETS_PER_POOL, "poolSizeCount": 1, "pPoolSizes": size})
        out = new("VkDescriptorPool*")
        check(lib.vkCreateDescriptorPool(self.device.handle, info, NULL, out), "descriptor pool")
        self._pools.append(out[0])
        self._free_in_pool = SETS_PER_POOL

    def close(self) -> None:
        h = self.device.handle
        for pool in self._pools:
            lib.vkDestroyDescriptorPool(h, pool, NULL)
        self._pools, self._sets = [], {}
        for attr, destroy in (("handle", lib.vkDestroyPipeline),
                              ("layout", lib.vkDestroyPipelineLayout),
                              ("set_layout", lib.vkDestroyDescriptorSetLayout),
                              ("module", lib.vkDestroyShaderModule)):
            if getattr(self, attr) is not None:
                destroy(h, getattr(self, attr), NULL)
                setattr(self, attr, None)
        self.device.release(self)

    def __repr__(self) -> str:
        return f"Pipeline({self.name}, spec={self.spec}, local_size={self.local_size})"


class PipelineCache:
    """Pipelines of one device, built on first use from the metadata in `spirv_dir`.

    Raises: MetadataError (from `load_modules`) when the metadata is missing or stale.
    """

    def __init__(self, device: Device, spirv_dir: Path = DEFAULT_SPIRV_DIR):
        self.device, self.spirv_dir = device, Path(spirv_dir)
        self.modules = load_modules(self.spirv_dir)
        self._pipelines: dict[tuple, Pipeline] = {}

    def get_pipeline(self, name: str, spec: dict | None = None) -> Pipeline:
        """The pipeline of module `name` specialized with `spec` ({constant name or id: value}).

        Raises: ShaderInterfaceError for an unknown module or specialization constant.
        """
        spec = spec or {}
        key = (name, tuple(sorted(spec.items(), key=lambda kv: str(kv[0]))))
        found = self._pipelines.get(key)
        if found is None:
            if name not in self.modules:
                raise ShaderInterfaceError(
                    f"no shader module {name!r}; known: {', '.join(sorted(self.modules))}")
            found = Pipeline(self.device, self.modules[name], read_spirv(name, self.spirv_dir), spec)
            self._pipelines[key] = found
        return found

