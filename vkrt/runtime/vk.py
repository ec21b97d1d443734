"""The one import of the PyPI `vulkan` binding (cffi, ABI mode), and the VkResult check.

`import vulkan` dlopens `libvulkan.so.1` at import time and raises OSError when the loader is
absent; that is turned into `NoVulkanDriverError` with the fix in the message.
Hot paths call `lib.vkXxx` directly with cffi structs built once (2.9-4.0 us per dispatch
against 32-39 us through the binding's per-call wrappers, measured on lavapipe's host).
"""
from __future__ import annotations

from vkrt.errors import DeviceLostError, DeviceMemoryError, NoVulkanDriverError, VkrtError

INSTALL_HINT = ("install a Vulkan loader and driver, e.g. on Debian/Ubuntu "
                "`apt-get install libvulkan1 mesa-vulkan-drivers` (lavapipe, a CPU Vulkan driver)")

try:
    import vulkan as vk  # noqa: F401  (re-exported)
except OSError as e:  # libvulkan.so.1 missing
    raise NoVulkanDriverError(f"no Vulkan loader found ({e}); {INSTALL_HINT}") from None

ffi = vk.ffi
lib = vk.lib
NULL = ffi.NULL
WHOLE_SIZE = 2**64 - 1  # vulkan.VK_WHOLE_SIZE is -1 in the binding (OverflowError as VkDeviceSize)

_OOM = {vk.VK_ERROR_OUT_OF_DEVICE_MEMORY: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
        vk.VK_ERROR_OUT_OF_HOST_MEMORY: "VK_ERROR_OUT_OF_HOST_MEMORY"}


def check(result: int, what: str) -> int:
    """Raise for a negative VkResult returned by a direct `lib` call; return it otherwise.

    Raises: DeviceMemoryError for out-of-memory results, DeviceLostError for
    VK_ERROR_DEVICE_LOST, the binding's own exception class for the others, VkrtError when
    none is known.
    """
    if result >= 0:
        return result
    if result in _OOM:
        raise DeviceMemoryError(f"{what}: {_OOM[result]}")
    if result == vk.VK_ERROR_DEVICE_LOST:
        raise DeviceLostError(f"{what}: VK_ERROR_DEVICE_LOST")
    exc = vk.exception_codes.get(result)
    if exc is not None:
        raise exc(f"{what}: VkResult {result}")
    raise VkrtError(f"{what}: VkResult {result}")


def new(ctype: str, init=None):
    """`ffi.new` spelled once; callers keep the result alive while Vulkan may read it."""
    return ffi.new(ctype, init) if init is not None else ffi.new(ctype)
