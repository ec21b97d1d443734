"""`Device`: the Vulkan instance, the physical-device choice, the logical device and its compute
queue. The one place that knows about validation layers and device features.

Choice: `VKRT_DEVICE` (or `Device(index=N)`) picks by index as `list_devices()` lists them;
otherwise `default_device` prefers a discrete GPU, then an integrated GPU, a virtual GPU, a CPU
implementation (lavapipe), any other, the lowest index among equals. No loader or no device
raises `NoVulkanDriverError` saying how to install lavapipe.
"""
from __future__ import annotations

from dataclasses import dataclass

from vkrt import config
from vkrt.errors import NoVulkanDriverError, VkrtError
from vkrt.runtime.vk import INSTALL_HINT, NULL, check, ffi, lib, new, vk

API_VERSION = vk.VK_MAKE_VERSION(1, 2, 0)
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"

_TYPE_NAMES = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete",
               vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated",
               vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual",
               vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
               vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: "other"}


# Subgroup operations the kernels use (GL_KHR_shader_subgroup_basic, _arithmetic, _shuffle;
# Vulkan spec, VkSubgroupFeatureFlagBits), in compute shaders.
SUBGROUP_OPERATIONS = {"basic": vk.VK_SUBGROUP_FEATURE_BASIC_BIT,
                       "arithmetic": vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT,
                       "shuffle": vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT}


def check_subgroup_support(name: str, stages: int, operations: int) -> None:
    """Raise VkrtError (one line, naming the device and what is missing) unless compute
    shaders of device `name` support every operation of SUBGROUP_OPERATIONS
    (VkPhysicalDeviceSubgroupProperties.supportedStages / supportedOperations)."""
    if not stages & vk.VK_SHADER_STAGE_COMPUTE_BIT:
        raise VkrtError(f"{name}: subgroup operations are not supported in compute shaders "
                        f"(supportedStages {stages:#x}); vkrt's kernels reduce with them")
    missing = [op for op, bit in SUBGROUP_OPERATIONS.items() if not operations & bit]
    if missing:
        raise VkrtError(f"{name}: subgroup operations {', '.join(missing)} are not supported "
                        f"(supportedOperations {operations:#x}); vkrt's kernels use "
                        f"{', '.join(SUBGROUP_OPERATIONS)}")


def compute_queue_family(name: str, flags: list[int]) -> int:
    """The first queue family whose flags (VkQueueFamilyProperties.queueFlags, one per family)
    include VK_QUEUE_COMPUTE_BIT. Raises VkrtError naming device `name` when none does."""
    for i, f in enumerate(flags):
        if f & vk.VK_QUEUE_COMPUTE_BIT:
            return i
    raise VkrtError(f"{name}: none of its {len(flags)} queue families supports compute "
                    f"(queueFlags {', '.join(f'{f:#x}' for f in flags) or 'none'})")


@dataclass(frozen=True)
class DeviceInfo:
    """What `vkrt devices` prints for one physical device."""
    index: int
    name: str
    kind: str               # discrete | integrated | virtual | cpu | other
    api_version: str        # e.g. "1.3.230"
    driver_version: int


# VkComponentTypeKHR values by name (Vulkan spec, VK_KHR_cooperative_matrix) and VkScopeKHR.
_COMPONENT_NAMES = {vk.VK_COMPONENT_TYPE_FLOAT16_KHR: "float16",
                    vk.VK_COMPONENT_TYPE_FLOAT32_KHR: "float32",
                    vk.VK_COMPONENT_TYPE_FLOAT64_KHR: "float64",
                    vk.VK_COMPONENT_TYPE_SINT8_KHR: "int8", vk.VK_COMPONENT_TYPE_SINT16_KHR: "int16",
                    vk.VK_COMPONENT_TYPE_SINT32_KHR: "int32", vk.VK_COMPONENT_TYPE_SINT64_KHR: "int64",
                    vk.VK_COMPONENT_TYPE_UINT8_KHR: "uint8", vk.VK_COMPONENT_TYPE_UINT16_KHR: "uint16",
                    vk.VK_COMPONENT_TYPE_UINT32_KHR: "uint32",
                    vk.VK_COMPONENT_TYPE_UINT64_KHR: "uint64"}
_SCOPE_NAMES = {vk.VK_SCOPE_DEVICE_KHR: "device", vk.VK_SCOPE_WORKGROUP_KHR: "workgroup",
                vk.VK_SCOPE_SUBGROUP_KHR: "subgroup", vk.VK_SCOPE_QUEUE_FAMILY_KHR: "queue_family"}
COOPERATIVE_MATRIX = "VK_KHR_cooperative_matrix"
INTEGER_DOT_PRODUCT = "VK_KHR_shader_integer_dot_product"
PIPELINE_STATISTICS = "VK_KHR_pipeline_executable_properties"


@dataclass(frozen=True)
class CoopShape:
    """One shape a device multiplies in cooperative matrices (VkCooperativeMatrixPropertiesKHR,
    from vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR): Result[M, N] = A[M, K] * B[K, N]
    + C[M, N], component types by name (`float16`, `float32`, `int8`, ...), scope
    (`subgroup`, `workgroup`, ...), saturating accumulation (integer types only)."""
    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str
    scope: str
    saturating: bool = False


def coop_shapes(props) -> tuple[CoopShape, ...]:
    """The CoopShape of each VkCooperativeMatrixPropertiesKHR in `props` (a sequence)."""
    def name(t):
        return _COMPONENT_NAMES.get(t, f"component type {t}")
    return tuple(CoopShape(p.MSize, p.NSize, p.KSize, name(p.AType), name(p.BType),
                           name(p.CType), name(p.ResultType),
                           _SCOPE_NAMES.get(p.scope, f"scope {p.scope}"),
                           bool(p.saturatingAccumulation)) for p in props)


class ValidationError(VkrtError):
    """The Khronos validation layer reported an error (only with VKRT_VALIDATION=1)."""


# Messages the layer raises about itself, not about vkrt's use of Vulkan.
# UNASSIGNED-VkSemaphore-state-timeout: the layer's own tracking thread gave up waiting for a
# timeline semaphore (its text: "This is most likely a validation bug"); seen on lavapipe
# under load when a submission legitimately waits on a host-signalled semaphore
# (Stream.hold in tests/test_stream.py) for longer than the layer's internal timeout.
LAYER_SELF_DIAGNOSTICS = frozenset({"UNASSIGNED-VkSemaphore-state-timeout"})


def _create_instance(validation: bool):
    app = new("VkApplicationInfo*", {"sType": vk.VK_STRUCTURE_TYPE_APPLICATION_INFO,
                                      "apiVersion": API_VERSION})
    keep = [app]
    info = {"sType": vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, "pApplicationInfo": app}
    if validation:
        layers = [p.layerName for p in vk.vkEnumerateInstanceLayerProperties()]
        if VALIDATION_LAYER not in layers:
            raise VkrtError(f"VKRT_VALIDATION=1 but {VALIDATION_LAYER} is not installed "
                            "(Debian: apt-get install vulkan-validationlayers)")
        names = [new("char[]", VALIDATION_LAYER.encode()), new("char[]", b"VK_EXT_debug_utils")]
        layer_ptr = new("char*[1]", [names[0]])
        ext_ptr = new("char*[1]", [names[1]])
        # Synchronization validation is opt-in, through VkValidationFeaturesEXT
        # (VK_LAYER_ENABLES did not enable it in Debian's layer 1.3.239).
        enables = new("VkValidationFeatureEnableEXT[1]",
                      [vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT])
        features = new("VkValidationFeaturesEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT,
            "enabledValidationFeatureCount": 1, "pEnabledValidationFeatures": enables})
        keep += [names, layer_ptr, ext_ptr, enables, features]
        info.update(enabledLayerCount=1, ppEnabledLayerNames=layer_ptr,
                    enabledExtensionCount=1, ppEnabledExtensionNames=ext_ptr, pNext=features)
    create_info = new("VkInstanceCreateInfo*", info)
    out = new("VkInstance*")
    result = lib.vkCreateInstance(create_info, NULL, out)
    if result == vk.VK_ERROR_INCOMPATIBLE_DRIVER:
        raise NoVulkanDriverError(f"no Vulkan driver (ICD) found; {INSTALL_HINT}")
    check(result, "vkCreateInstance")
    return out[0]


def _physical_devices(instance) -> list:
    devices = vk.vkEnumeratePhysicalDevices(instance)
    if not devices:
        raise NoVulkanDriverError(f"the Vulkan loader found no device; {INSTALL_HINT}")
    return devices


def _info(index: int, pd) -> DeviceInfo:
    p = vk.vkGetPhysicalDeviceProperties(pd)
    v = p.apiVersion
    return DeviceInfo(index, p.deviceName, _TYPE_NAMES.get(p.deviceType, "other"),
                      f"{v >> 22}.{(v >> 12) & 0x3FF}.{v & 0xFFF}", p.driverVersion)


def validation_layer_available() -> bool:
    """Whether the Khronos validation layer (VK_LAYER_KHRONOS_validation; Debian package
    `vulkan-validationlayers`) is installed, so that `Device(validation=True)` can start."""
    return VALIDATION_LAYER in [p.layerName for p in vk.vkEnumerateInstanceLayerProperties()]


def list_devices() -> list[DeviceInfo]:
    """Every Vulkan physical device, in the order `VKRT_DEVICE` indexes them.

    Raises: NoVulkanDriverError when there is no loader, driver or device.
    """
    instance = _create_instance(validation=False)
    try:
        return [_info(i, pd) for i, pd in enumerate(_physical_devices(instance))]
    finally:
        lib.vkDestroyInstance(instance, NULL)


# Preference without VKRT_DEVICE: a lower rank wins, then a lower index.
KIND_PREFERENCE = ("discrete", "integrated", "virtual", "cpu", "other")


def default_device(infos: list[DeviceInfo]) -> int:
    """Index of the device `Device()` opens when no index is given: the first by
    KIND_PREFERENCE, ties broken by the lowest index. Raises ValueError on an empty list."""
    return min(infos, key=lambda d: (KIND_PREFERENCE.index(d.kind), d.index)).index


def choose_device(infos: list[DeviceInfo], index: int | None) -> int:
    """`index` if given and in range, else `default_device(infos)`.

    Raises: VkrtError naming the index and the device count when out of range.
    """
    if index is not None:
        if not 0 <= index < len(infos):
            raise VkrtError(f"device index {index} out of range: {len(infos)} Vulkan device(s) "
                            "(see `vkrt devices`)")
        return index
    return default_device(infos)


class Device:
    """One logical device with one compute queue.

    Args:
        index: physical-device index; default `VKRT_DEVICE`, else `default_device` (discrete,
            integrated, virtual GPU, then CPU; lowest index among equals).
        validation: enable the Khronos validation layer with synchronization validation;
            default `VKRT_VALIDATION`. Errors it reports are collected and raised by
            `check_validation()` (the stream calls it after each fence wait).
        direct_host_access: map device-local buffers when their memory is host-visible, so
            host reads and writes are a memcpy; default True on CPU and integrated devices.
            False forces the staging-copy path a discrete GPU takes (tests use it on lavapipe).
        pipeline_statistics: enable VK_KHR_pipeline_executable_properties so that every
            pipeline is created with VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR and
            `Pipeline.statistics()` reports what the driver compiled (registers, spills, ...);
            a tuning aid (bench/matvec_types.py --pipeline-stats), off by default. Raises
            VkrtError where the device does not offer the extension or its
            pipelineExecutableInfo feature.
    Attributes beside the handles: `features` (the optional features enabled, by Vulkan
    name: shaderFloat16, vulkanMemoryModel, cooperativeMatrix, ...), `coop_shapes` (every
    cooperative-matrix shape the device lists, `CoopShape`; () without
    VK_KHR_cooperative_matrix) and `coop_shape()` (the one matmul_coop runs on, or None),
    `bytes_in_use` (the memory vkrt's buffers hold, bytes), `staging_bytes_in_use` (of it,
    the host-visible staging buffers': host memory on a discrete GPU) and
    `device_local_bytes` (the largest device-local heap, bytes), beside the limits the
    kernels check.
    Raises: NoVulkanDriverError, VkrtError (bad index, missing validation layer).
    Use as a context manager, or call `close()`: Vulkan objects are released explicitly,
    not by the garbage collector.
    """

    def __init__(self, index: int | None = None, validation: bool | None = None,
                 direct_host_access: bool | None = None, pipeline_statistics: bool = False):
        self.validation = config.VALIDATION.value if validation is None else validation
        self.direct_host_access = direct_host_access
        self.pipeline_statistics = pipeline_statistics
        self.validation_errors: list[str] = []
        self._closers: list = []
        self._children: dict[int, object] = {}  # buffers, pipelines, streams: closed first
        self._queues: dict[int, object] = {}    # each stream's Submitter (`retire`)
        self.bytes_in_use = 0  # memory allocated by Buffer, in bytes (staging included)
        self.staging_bytes_in_use = 0  # of it, host-visible staging buffers' (host memory)
        self.lost: str | None = None   # why VK_ERROR_DEVICE_LOST ended it (queue.py), else None
        self.instance = _create_instance(self.validation)
        try:
            self._setup(config.DEVICE.value if index is None else index)
        except BaseException:
            self.close()
            raise

    def _setup(self, index: int | None) -> None:
        if self.validation:
            self._install_messenger()
        pds = _physical_devices(self.instance)
        infos = [_info(i, pd) for i, pd in enumerate(pds)]
        self.info = infos[choose_device(infos, index)]
        self.physical = pds[self.info.index]
        if self.direct_host_access is None:
            self.direct_host_access = self.info.kind in ("cpu", "integrated")
        props = vk.vkGetPhysicalDeviceProperties(self.physical)
        # props owns the memory that props.limits points into: keep it alive with the device.
        self.properties, self.limits = props, props.limits
        self.max_storage_buffer_range = props.limits.maxStorageBufferRange
        self.min_storage_buffer_offset_alignment = props.limits.minStorageBufferOffsetAlignment
        self.max_compute_work_group_count = tuple(props.limits.maxComputeWorkGroupCount)
        self.max_push_constants_size = props.limits.maxPushConstantsSize
        self.timestamp_period_ns = props.limits.timestampPeriod
        maintenance3 = new("VkPhysicalDeviceMaintenance3Properties*",
                           {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES})
        float_controls = new("VkPhysicalDeviceFloatControlsProperties*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES,
            "pNext": maintenance3})
        subgroup = new("VkPhysicalDeviceSubgroupProperties*",
                       {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                        "pNext": float_controls})
        driver = new("VkPhysicalDeviceDriverProperties*",
                     {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES,
                      "pNext": subgroup})
        props2 = new("VkPhysicalDeviceProperties2*",
                     {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": driver})
        lib.vkGetPhysicalDeviceProperties2(self.physical, props2)
        self.subgroup_size = subgroup.subgroupSize  # 8 on lavapipe, 32 on NVIDIA
        check_subgroup_support(self.info.name, subgroup.supportedStages,
                               subgroup.supportedOperations)
        # Float widths whose infinities, NaNs and signed zeros a shader may ask to keep
        # (SignedZeroInfNanPreserve; Vulkan 1.2 VkPhysicalDeviceFloatControlsProperties):
        # pipeline.py refuses a module that declares a width missing here.
        self.inf_nan_preserve = {
            16: bool(float_controls.shaderSignedZeroInfNanPreserveFloat16),
            32: bool(float_controls.shaderSignedZeroInfNanPreserveFloat32),
            64: bool(float_controls.shaderSignedZeroInfNanPreserveFloat64)}
        # VkPhysicalDeviceDriverProperties (Vulkan 1.2): e.g. "NVIDIA" / "580.159.04",
        # "llvmpipe" / "Mesa 22.3.6 (LLVM 15.0.6)".
        self.driver_name = ffi.string(driver.driverName).decode("utf-8", "replace")
        self.driver_info = ffi.string(driver.driverInfo).decode("utf-8", "replace")
        # The largest single VkDeviceMemory (Vulkan 1.1 core; weights are suballocated from
        # allocations no larger than this).
        self.max_memory_allocation_size = maintenance3.maxMemoryAllocationSize
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        self.queue_family = compute_queue_family(self.info.name,
                                                 [f.queueFlags for f in families])
        self.timestamp_valid_bits = families[self.queue_family].timestampValidBits
        self.memory_properties = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        mp = self.memory_properties
        # The largest heap with VK_MEMORY_HEAP_DEVICE_LOCAL_BIT (Vulkan spec 11.2.1): a
        # discrete GPU's video memory, lavapipe's share of system memory (2 GiB).
        self.device_local_bytes = max(
            (mp.memoryHeaps[i].size for i in range(mp.memoryHeapCount)
             if mp.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT), default=0)
        self._create_device()

    def _install_messenger(self) -> None:
        errors = self.validation_errors

        @ffi.callback("VkBool32(VkDebugUtilsMessageSeverityFlagBitsEXT, "
                      "VkDebugUtilsMessageTypeFlagsEXT, "
                      "const VkDebugUtilsMessengerCallbackDataEXT*, void*)")
        def callback(severity, types, data, user):
            if severity & (vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT
                           | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT):
                message_id = ffi.string(data.pMessageIdName) if data.pMessageIdName else b""
                if message_id.decode(errors="replace") not in LAYER_SELF_DIAGNOSTICS:
                    errors.append(ffi.string(data.pMessage).decode(errors="replace"))
            return 0

        create = vk.vkGetInstanceProcAddr(self.instance, "vkCreateDebugUtilsMessengerEXT")
        destroy = vk.vkGetInstanceProcAddr(self.instance, "vkDestroyDebugUtilsMessengerEXT")
        info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=(vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT
                             | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT),
            messageType=(vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
                         | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                         | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT),
            pfnUserCallback=callback)
        self._callback = callback  # the C side holds only a raw pointer
        messenger = create(self.instance, info, None)
        self._closers.append(lambda: destroy(self.instance, messenger, None))

    def _create_device(self) -> None:
        # 16-bit storage and float16 are enabled when present: shaders that use them without
        # the features enabled trip VUID-RuntimeSpirv-storageBuffer16BitAccess-06331 (seen on
        # lavapipe with Debian's layer 1.3.239).
        f11 = new("VkPhysicalDeviceVulkan11Features*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES})
        f12 = new("VkPhysicalDeviceVulkan12Features*",
                  {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, "pNext": f11})
        f2 = new("VkPhysicalDeviceFeatures2*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": f12})
        lib.vkGetPhysicalDeviceFeatures2(self.physical, f2)
        want11 = new("VkPhysicalDeviceVulkan11Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
            "storageBuffer16BitAccess": f11.storageBuffer16BitAccess})
        want12 = new("VkPhysicalDeviceVulkan12Features*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, "pNext": want11,
            "shaderFloat16": f12.shaderFloat16, "storageBuffer8BitAccess": f12.storageBuffer8BitAccess,
            "shaderInt8": f12.shaderInt8, "vulkanMemoryModel": f12.vulkanMemoryModel})
        # Submissions are ordered by a timeline semaphore (queue.py): core in Vulkan 1.2, but
        # an optional feature (spec 7.4 "Semaphores"; Roadmap 2022 requires it).
        if not f12.timelineSemaphore:
            raise VkrtError(f"{self.info.name}: the Vulkan 1.2 feature timelineSemaphore is "
                            f"not supported (vkrt orders submissions with one)")
        want12.timelineSemaphore = 1
        self.features = {"storageBuffer16BitAccess": bool(f11.storageBuffer16BitAccess),
                         "shaderFloat16": bool(f12.shaderFloat16), "timelineSemaphore": True,
                         "storageBuffer8BitAccess": bool(f12.storageBuffer8BitAccess),
                         "shaderInt8": bool(f12.shaderInt8),
                         "vulkanMemoryModel": bool(f12.vulkanMemoryModel),
                         "cooperativeMatrix": False, "shaderIntegerDotProduct": False,
                         "pipelineExecutableInfo": False}
        extensions = self._calibration_extension()
        # VK_KHR_cooperative_matrix (tensor cores), enabled only when the device offers the
        # extension and its cooperativeMatrix feature (VkPhysicalDeviceCooperativeMatrix-
        # FeaturesKHR): its modules (matmul_coop_*) also need shaderFloat16 and the Vulkan
        # memory model, which glslang's GL_KHR_memory_scope_semantics declares.
        chain, coop = want12, self._cooperative_matrix()   # both stay alive to vkCreateDevice
        if coop is not None:
            coop.pNext, chain = chain, coop
            extensions.append(COOPERATIVE_MATRIX)
        # VK_KHR_shader_integer_dot_product (core in Vulkan 1.3; vkrt asks for 1.2): the
        # packed 4x8-bit dot products of the decode products' XQ variants (glsl/unit_xq.glsl).
        dot = self._integer_dot_product()
        if dot is not None:
            dot.pNext, chain = chain, dot
            extensions.append(INTEGER_DOT_PRODUCT)
        stats = self._pipeline_executable_info() if self.pipeline_statistics else None
        if stats is not None:
            stats.pNext, chain = chain, stats
            extensions.append(PIPELINE_STATISTICS)
        ext_names = [new("char[]", e.encode()) for e in extensions]
        ext_ptr = new("char*[]", ext_names) if ext_names else NULL
        priority = new("float[1]", [1.0])
        queue_info = new("VkDeviceQueueCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
            "queueFamilyIndex": self.queue_family, "queueCount": 1, "pQueuePriorities": priority})
        info = new("VkDeviceCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "pNext": chain,
            "queueCreateInfoCount": 1, "pQueueCreateInfos": queue_info,
            "enabledExtensionCount": len(ext_names), "ppEnabledExtensionNames": ext_ptr})
        out = new("VkDevice*")
        check(lib.vkCreateDevice(self.physical, info, NULL, out), "vkCreateDevice")
        self.handle = out[0]
        self._closers.append(lambda: lib.vkDestroyDevice(self.handle, NULL))
        if self.calibrated_timestamps:
            self._get_calibrated = vk.vkGetDeviceProcAddr(self.handle,
                                                          "vkGetCalibratedTimestampsEXT")
            self._calibration_info = new("VkCalibratedTimestampInfoEXT[2]", [
                {"sType": vk.VK_STRUCTURE_TYPE_CALIBRATED_TIMESTAMP_INFO_EXT,
                 "timeDomain": vk.VK_TIME_DOMAIN_DEVICE_EXT},
                {"sType": vk.VK_STRUCTURE_TYPE_CALIBRATED_TIMESTAMP_INFO_EXT,
                 "timeDomain": vk.VK_TIME_DOMAIN_CLOCK_MONOTONIC_EXT}])
            self._calibration_out = new("uint64_t[2]")
        queue = new("VkQueue*")
        lib.vkGetDeviceQueue(self.handle, self.queue_family, 0, queue)
        self.queue = queue[0]

    def _cooperative_matrix(self):
        """The VkPhysicalDeviceCooperativeMatrixFeaturesKHR to chain into device creation when
        the device offers VK_KHR_cooperative_matrix with its cooperativeMatrix feature in
        compute shaders (cooperativeMatrixSupportedStages), else None. Sets `coop_shapes`:
        every shape vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR lists (Vulkan spec,
        "Cooperative Matrices"), () without the extension; `features["cooperativeMatrix"]`."""
        self.coop_shapes: tuple[CoopShape, ...] = ()
        if not self._offers(COOPERATIVE_MATRIX):
            return None
        feat = new("VkPhysicalDeviceCooperativeMatrixFeaturesKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR})
        f2 = new("VkPhysicalDeviceFeatures2*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": feat})
        lib.vkGetPhysicalDeviceFeatures2(self.physical, f2)
        cprops = new("VkPhysicalDeviceCooperativeMatrixPropertiesKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR})
        p2 = new("VkPhysicalDeviceProperties2*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": cprops})
        lib.vkGetPhysicalDeviceProperties2(self.physical, p2)
        if not (feat.cooperativeMatrix
                and cprops.cooperativeMatrixSupportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT):
            return None
        # The raw entry point (an instance-level function of a device extension), so that each
        # output element carries its sType as the spec requires (the binding's wrapper leaves
        # them zero).
        name = b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
        raw = lib.vkGetInstanceProcAddr(self.instance, name)
        if raw == NULL:
            return None
        get = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", raw)
        count = new("uint32_t*")
        check(get(self.physical, count, NULL), "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
        props = new("VkCooperativeMatrixPropertiesKHR[]", max(1, count[0]))
        for i in range(count[0]):
            props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
        check(get(self.physical, count, props),
              "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
        self.coop_shapes = coop_shapes([props[i] for i in range(count[0])])
        self.features["cooperativeMatrix"] = True
        return new("VkPhysicalDeviceCooperativeMatrixFeaturesKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
            "cooperativeMatrix": 1})

    def _offers(self, extension: str) -> bool:
        """Whether the physical device lists device extension `extension`."""
        try:
            props = vk.vkEnumerateDeviceExtensionProperties(self.physical, None)
        except vk.VkError:
            return False
        return extension in [e.extensionName for e in props]

    def _integer_dot_product(self):
        """The VkPhysicalDeviceShaderIntegerDotProductFeatures to chain into device creation
        when the device offers VK_KHR_shader_integer_dot_product with its
        shaderIntegerDotProduct feature, else None; sets `features["shaderIntegerDotProduct"]`."""
        if not self._offers(INTEGER_DOT_PRODUCT):
            return None
        stype = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES
        feat = new("VkPhysicalDeviceShaderIntegerDotProductFeatures*", {"sType": stype})
        f2 = new("VkPhysicalDeviceFeatures2*",
                 {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": feat})
        lib.vkGetPhysicalDeviceFeatures2(self.physical, f2)
        if not feat.shaderIntegerDotProduct:
            return None
        self.features["shaderIntegerDotProduct"] = True
        return new("VkPhysicalDeviceShaderIntegerDotProductFeatures*",
                   {"sType": stype, "shaderIntegerDotProduct": 1})

    def _pipeline_executable_info(self):
        """The VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR to chain into device
        creation (pipeline_statistics=True).

        Raises:
            VkrtError: the device does not offer VK_KHR_pipeline_executable_properties or its
            pipelineExecutableInfo feature (lavapipe offers neither)."""
        stype = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR
        feat = new("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR*", {"sType": stype})
        if self._offers(PIPELINE_STATISTICS):
            f2 = new("VkPhysicalDeviceFeatures2*",
                     {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": feat})
            lib.vkGetPhysicalDeviceFeatures2(self.physical, f2)
        if not feat.pipelineExecutableInfo:
            raise VkrtError(f"{self.info.name}: pipeline statistics need "
                            f"{PIPELINE_STATISTICS} with its pipelineExecutableInfo feature, "
                            f"which this device does not offer")
        self.features["pipelineExecutableInfo"] = True
        return new("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR*",
                   {"sType": stype, "pipelineExecutableInfo": 1})

    def coop_shape(self, a: str = "float16", c: str = "float32") -> CoopShape | None:
        """The subgroup-scope shape with A and B of type `a`, C and Result of type `c` that
        matmul_coop can use (M, N and K each 8, 16 or 32: whole f16vec4 loads, K dividing its
        32-column step), 16x16x16 first (the common NVIDIA one), then the largest K; None when
        the device lists none."""
        fits = [s for s in self.coop_shapes
                if s.a == s.b == a and s.c == s.result == c and s.scope == "subgroup"
                and all(v in (8, 16, 32) for v in (s.m, s.n, s.k))]
        if not fits:
            return None
        return min(fits, key=lambda s: ((s.m, s.n, s.k) != (16, 16, 16), -s.k, -s.m * s.n))

    def _calibration_extension(self) -> list[str]:
        """VK_EXT_calibrated_timestamps when the device offers it with both the device and
        CLOCK_MONOTONIC domains (Python's perf_counter_ns clock on Linux): GPU timestamps
        then map onto host time (`calibrate`)."""
        self.calibrated_timestamps = False
        name = "VK_EXT_calibrated_timestamps"
        if not self._offers(name) or not self.timestamp_valid_bits:
            return []
        try:
            domains = vk.vkGetInstanceProcAddr(
                self.instance, "vkGetPhysicalDeviceCalibrateableTimeDomainsEXT")(self.physical)
        except vk.VkError:
            return []
        domains = set(domains)
        if {vk.VK_TIME_DOMAIN_DEVICE_EXT, vk.VK_TIME_DOMAIN_CLOCK_MONOTONIC_EXT} <= domains:
            self.calibrated_timestamps = True
            return [name]
        return []

    def calibrate(self) -> tuple[int, int] | None:
        """(device timestamp ticks, host CLOCK_MONOTONIC ns) sampled together, or None
        without VK_EXT_calibrated_timestamps."""
        if not self.calibrated_timestamps:
            return None
        self._get_calibrated(self.handle, 2, self._calibration_info, self._calibration_out)
        return int(self._calibration_out[0]), int(self._calibration_out[1])

    def memory_type(self, required: int, preferred: int, type_bits: int) -> int:
        """Index of a memory type allowed by `type_bits` with all `required` property flags,
        preferring one that also has `preferred` (Vulkan spec 11.2.1, memory type selection)."""
        mp = self.memory_properties
        candidates = [i for i in range(mp.memoryTypeCount)
                      if type_bits & (1 << i)
                      and mp.memoryTypes[i].propertyFlags & required == required]
        for i in candidates:
            if mp.memoryTypes[i].propertyFlags & preferred == preferred:
                return i
        if not candidates:
            raise VkrtError(f"{self.info.name}: no memory type with flags {required:#x}")
        return candidates[0]

    def adopt(self, child) -> None:
        """Register an object whose `close()` must run before the device is destroyed."""
        self._children[id(child)] = child

    def drain(self) -> None:
        """Submit and wait for the work every stream of this device has recorded."""
        for child in list(self._children.values()):
            sync = getattr(child, "synchronize", None)
            if sync is not None:
                sync()

    def retire(self, buffer) -> bool:
        """Called by `Buffer.close`: True when some stream's recorded or in-flight command
        still names `buffer`, which that stream's submitter then destroys once the submission
        has completed (Vulkan spec, vkDestroyBuffer: "All submitted commands that refer to
        buffer ... must have completed execution"); False when it may be destroyed now. Used
        by several streams at once, the host waits for all but the last."""
        users = [(q, v) for q in list(self._queues.values())
                 if (v := q.pending_use_of(buffer.serial))]
        for queue, value in users[:-1]:
            queue.wait(value)
        if not users:
            return False
        queue, value = users[-1]
        queue.defer_free(buffer, value)
        return True

    def add_queue(self, queue) -> None:
        """Register a stream's `Submitter` (queue.py), whose commands `retire` asks about."""
        self._queues[id(queue)] = queue

    def remove_queue(self, queue) -> None:
        self._queues.pop(id(queue), None)

    def release(self, child) -> None:
        self._children.pop(id(child), None)

    @property
    def name(self) -> str:
        return self.info.name

    def check_validation(self) -> None:
        """Raise ValidationError with the first message if the validation layer reported any."""
        if self.validation_errors:
            msgs, self.validation_errors[:] = list(self.validation_errors), []
            raise ValidationError(f"{len(msgs)} validation message(s); first: {msgs[0]}")

    def wait_idle(self) -> None:
        check(lib.vkDeviceWaitIdle(self.handle), "vkDeviceWaitIdle")

    def close(self) -> None:
        """Destroy the device and instance. Objects created from this device (buffers,
        pipelines, streams) must be closed first; `Device.close` waits for the queue to idle."""
        if getattr(self, "handle", None) is not None:
            lib.vkDeviceWaitIdle(self.handle)
        for child in reversed(list(self._children.values())):
            child.close()
        while self._closers:
            self._closers.pop()()
        self.handle = None
        if self.instance is not None:
            lib.vkDestroyInstance(self.instance, NULL)
            self.instance = None

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Device({self.info.index}: {self.info.name}, {self.info.kind})"
