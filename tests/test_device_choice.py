"""Device choice without an index (issue 12): a discrete GPU, then an integrated GPU, a virtual
GPU, a CPU implementation, then anything else; the lowest index among equals. Checked on
fabricated `DeviceInfo` lists (no Vulkan call), and `vkrt devices` marks the device chosen."""
from __future__ import annotations

import itertools

import pytest

from vkrt import cli, config
from vkrt.errors import VkrtError
from vkrt.runtime import device as device_module
from vkrt.runtime.device import DeviceInfo, choose_device, default_device

RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}


def infos(*kinds: str) -> list[DeviceInfo]:
    return [DeviceInfo(i, f"{kind} {i}", kind, "1.3.0", 0) for i, kind in enumerate(kinds)]


@pytest.mark.parametrize("kinds,want", [
    (("cpu", "integrated"), 1),                    # the case: llvmpipe listed first
    (("cpu", "integrated", "discrete"), 2),
    (("integrated", "discrete", "discrete"), 1),   # two discrete GPUs: the lower index
    (("cpu", "virtual", "integrated"), 2),
    (("other", "cpu", "virtual"), 2),
    (("other", "cpu"), 1),
    (("cpu", "cpu"), 0),
    (("other",), 0),
])
def test_default_device_prefers_kinds_in_order(kinds, want):
    assert default_device(infos(*kinds)) == want
    assert choose_device(infos(*kinds), None) == want


def test_default_device_on_every_ordering_of_three_kinds():
    # Independent of list order: the best kind wins wherever it is listed, and among equal
    # kinds the lowest index.
    for kinds in itertools.product(RANK, repeat=3):
        devices = infos(*kinds)
        best = min(RANK[k] for k in kinds)
        want = next(d.index for d in devices if RANK[d.kind] == best)
        assert default_device(devices) == want, kinds


def test_explicit_index_wins_and_is_range_checked():
    devices = infos("cpu", "discrete")
    assert choose_device(devices, 0) == 0
    with pytest.raises(VkrtError, match=r"^device index 2 out of range: 2 Vulkan device\(s\)"):
        choose_device(devices, 2)
    with pytest.raises(VkrtError, match=r"^device index -1 out of range"):
        choose_device(devices, -1)


@pytest.fixture
def fake_devices(monkeypatch):
    devices = infos("cpu", "integrated", "cpu")
    monkeypatch.setattr(device_module, "list_devices", lambda: devices)
    return devices


def test_vkrt_devices_marks_the_default(fake_devices, capsys):
    with config.DEVICE.override(""):
        assert cli.main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["0: cpu 0 (cpu, Vulkan 1.3.0)",
                     "1: integrated 1 (integrated, Vulkan 1.3.0)  * default",
                     "2: cpu 2 (cpu, Vulkan 1.3.0)"]


def test_vkrt_devices_marks_vkrt_device(fake_devices, capsys):
    with config.DEVICE.override("2"):
        assert cli.main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [l for l in lines if "*" in l] == ["2: cpu 2 (cpu, Vulkan 1.3.0)  * VKRT_DEVICE"]


def test_vkrt_devices_lists_then_refuses_a_bad_vkrt_device(fake_devices, capsys):
    with config.DEVICE.override("5"):
        assert cli.main(["devices"]) == 1
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3 and "*" not in out
    assert err == "vkrt: error: device index 5 out of range: 3 Vulkan device(s) (see `vkrt devices`)\n"


def test_a_device_without_a_compute_queue_is_refused_in_one_line():
    from vkrt.runtime.device import compute_queue_family
    from vkrt.runtime.vk import vk

    graphics, transfer = vk.VK_QUEUE_GRAPHICS_BIT, vk.VK_QUEUE_TRANSFER_BIT
    assert compute_queue_family("gpu", [graphics, transfer | vk.VK_QUEUE_COMPUTE_BIT]) == 1
    for flags in ([graphics, transfer], []):
        with pytest.raises(VkrtError, match=r"^gpu: none of its \d queue families supports "
                                            r"compute") as e:
            compute_queue_family("gpu", flags)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("missing", ["basic", "arithmetic", "shuffle"])
def test_a_device_without_the_subgroup_operations_is_refused_in_one_line(missing):
    from vkrt.runtime.device import SUBGROUP_OPERATIONS, check_subgroup_support
    from vkrt.runtime.vk import vk

    every = sum(SUBGROUP_OPERATIONS.values())
    compute = vk.VK_SHADER_STAGE_COMPUTE_BIT
    check_subgroup_support("gpu", compute, every)       # all there: nothing raised
    with pytest.raises(VkrtError, match=rf"^gpu: subgroup operations {missing} are not "
                                        r"supported \(supportedOperations 0x"):
        check_subgroup_support("gpu", compute, every & ~SUBGROUP_OPERATIONS[missing])
    with pytest.raises(VkrtError, match="not supported in compute shaders"):
        check_subgroup_support("gpu", vk.VK_SHADER_STAGE_FRAGMENT_BIT, every)
