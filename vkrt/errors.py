"""The exceptions users catch. Every vkrt error derives from `VkrtError`; messages say what
was expected and what was found."""


class VkrtError(Exception):
    """Base class of every error vkrt raises on purpose."""


class CompileError(VkrtError):
    """A GLSL shader failed to compile; the message holds glslang's output with file:line."""


class ReflectionError(VkrtError):
    """A SPIR-V module is malformed or uses a shape the reflection refuses."""


class MetadataError(VkrtError):
    """The committed metadata is missing, stale, edited by hand or of an unknown version."""


class ShaderInterfaceError(VkrtError):
    """The host binds buffers or push constants that differ from what the shader declares."""


class NoVulkanDriverError(VkrtError):
    """No Vulkan loader or no Vulkan device is available."""


class DeviceMemoryError(VkrtError, MemoryError):
    """A device or host-visible allocation failed (VK_ERROR_OUT_OF_*_MEMORY)."""


class ModelFormatError(VkrtError):
    """A model file is truncated, corrupt, or of an unsupported architecture."""


class ConfigError(VkrtError, ValueError):
    """A `VKRT_*` environment variable, a command-line value or an API argument has a value of
    the wrong type or range; the message names it, the value, and what is accepted."""


class DeviceLostError(VkrtError):
    """The device was lost (VK_ERROR_DEVICE_LOST: a driver reset, or a desktop driver's
    watchdog ending a submission that ran too long). Every later use of that device raises
    this too: load the model again on a new `Device`."""
