"""Every VKRT_* switch parses what the README documents and refuses the rest in one line."""
import math

import pytest

from vkrt import config
from vkrt.errors import ConfigError, VkrtError


@pytest.mark.parametrize("switch, raw, value", [
    (config.DEVICE, "0", 0), (config.DEVICE, " 3 ", 3), (config.DEVICE, "", None),
    (config.VALIDATION, "1", True), (config.VALIDATION, "OFF", False),
    (config.PROFILE, "yes", True), (config.PROFILE, "no", False),
    (config.FENCE_TIMEOUT_S, "2.5", 2.5), (config.FENCE_TIMEOUT_S, "inf", math.inf),
    (config.FENCE_TIMEOUT_S, None, 600.0),
    (config.BARRIERS, "always", "always"), (config.MODEL, "m.gguf", "m.gguf"),
    (config.COOPMAT, "AUTO", "auto"), (config.COOPMAT, "1", "on"), (config.COOPMAT, "off", "off"),
    (config.COOPMAT, None, "auto"),
])
def test_accepted(switch, raw, value):
    with switch.override(raw):
        assert switch.value == value


@pytest.mark.parametrize("switch, raw", [
    (config.DEVICE, "abc"), (config.DEVICE, "-1"), (config.DEVICE, "1.0"),
    (config.VALIDATION, "maybe"), (config.PROFILE, "2"),
    (config.FENCE_TIMEOUT_S, "0"), (config.FENCE_TIMEOUT_S, "-inf"),
    (config.FENCE_TIMEOUT_S, "nan"), (config.FENCE_TIMEOUT_S, "ten"),
    (config.BARRIERS, "never"), (config.COOPMAT, "tensor"),
])
def test_refused_in_one_line(switch, raw):
    with switch.override(raw), pytest.raises(ConfigError) as info:
        switch.value
    msg = str(info.value)
    assert isinstance(info.value, VkrtError) and "\n" not in msg
    assert msg.startswith(f"{switch.name}={raw!r} is not valid: expected ")
