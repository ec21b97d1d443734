"""The paged KV cache on a device: how the engine's default sizes it, that a cache past
maxMemoryAllocationSize (its K/V views spread over several buffers, vkrt/models/scratch.py
`kv_cache`) gives the bits of a small one, and what an f16 cache changes in the logits.

    python bench/kv_cache.py [--gib 3,6,12] [--device N]

A random qwen2 file (tests/family_files.py, F32); one batched step of two sequences (5 and 2
tokens, blocks of 4 slots) on a 64-block cache, then on caches of each `--gib` size: prints
one JSON object with the device's heap, maxMemoryAllocationSize and maxStorageBufferRange,
`max_paged_blocks(4)` and its bytes, and per size the blocks, buffers, bytes and whether the
step's logits equal the 64-block cache's (np.array_equal). `f16_vs_f32`: per random family
(qwen2, gemma3; F32), one step of two prompts (11 and 6 random ids, seeded) with every
token's logits, on an f32 and on an f16 cache: the largest |logit difference|, the largest
|logit| and how many rows keep their argmax.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", default="3,6,12", help="cache sizes, GiB, comma-separated")
    ap.add_argument("--device", type=int, default=None)
    args = ap.parse_args()

    from family_files import hf_model, write_gguf
    from vkrt.models.batch import BatchInput
    from vkrt.models.gguf import load_gguf
    from vkrt.models.llama import Llama
    from vkrt.runtime.device import Device

    u32 = lambda v: np.asarray(v, np.uint32)  # noqa: E731
    # a: positions 0..4 in blocks 3 and 1; b: positions 0..1 in block 2 (blocks of 4 slots)
    step = BatchInput(u32([1, 2, 3, 4, 5, 6, 7]), u32([0, 1, 2, 3, 4, 0, 1]),
                      u32([0] * 5 + [1] * 2), u32([12, 13, 14, 15, 4, 8, 9]),
                      u32([[3, 1], [2, 0]]), u32(range(7)))
    with tempfile.TemporaryDirectory() as tmp, Device(args.device) as d:
        path = write_gguf(Path(tmp) / "qwen2.gguf", hf_model("qwen2"), "qwen2", "F32")
        m = Llama.from_gguf(d, load_gguf(path))
        try:
            m.setup_paged_cache(64, 4)
            want = m.execute_batch(step, want_logits=True).logits
            n = m.max_paged_blocks(4)
            report = {"device": d.name, "device_local_bytes": d.device_local_bytes,
                      "max_memory_allocation_size": d.max_memory_allocation_size,
                      "max_storage_buffer_range": d.max_storage_buffer_range,
                      "max_paged_blocks_4": n, "its_bytes": m.paged_cache_bytes(n, 4),
                      "sizes": []}
            per_block = m.paged_cache_bytes(2, 4) - m.paged_cache_bytes(1, 4)
            for gib in (float(g) for g in args.gib.split(",")):
                blocks = int(gib * (1 << 30)) // per_block
                m.setup_paged_cache(blocks, 4)
                got = m.execute_batch(step, want_logits=True).logits
                kv = m._paged.buffer
                report["sizes"].append({"gib": gib, "blocks": blocks, "buffers": len(kv.buffers),
                                        "bytes": kv.nbytes,
                                        "bit_identical": bool(np.array_equal(got, want))})
        finally:
            m.close()
        report["f16_vs_f32"] = {arch: f16_vs_f32(d, Path(tmp), arch)
                                for arch in ("qwen2", "gemma3")}
    print(json.dumps(report, indent=1))


def f16_vs_f32(device, folder: Path, arch: str) -> dict:
    """`main`'s f16_vs_f32 entry of one family."""
    from family_files import N_VOCAB, hf_model, write_gguf
    from vkrt.models.batch import BatchInput
    from vkrt.models.gguf import load_gguf
    from vkrt.models.llama import Llama

    rng = np.random.default_rng(3)
    lengths = (11, 6)
    ids = [int(i) for i in rng.integers(0, N_VOCAB, sum(lengths))]
    pos = [p for n in lengths for p in range(n)]
    seq = [s for s, n in enumerate(lengths) for _ in range(n)]
    tables = np.array([[0, 1, 2], [3, 4, 5]], np.uint32)          # blocks of 4 slots
    slots = [int(tables[s, p // 4]) * 4 + p % 4 for s, p in zip(seq, pos)]
    u32 = lambda v: np.asarray(v, np.uint32)  # noqa: E731
    step = BatchInput(u32(ids), u32(pos), u32(seq), u32(slots), tables, u32(range(len(ids))))
    m = Llama.from_gguf(device, load_gguf(write_gguf(folder / f"{arch}.gguf", hf_model(arch),
                                                     arch, "F32")))
    try:
        logits = {}
        for kv_dtype in ("float32", "float16"):
            m.setup_paged_cache(8, 4, kv_dtype)
            logits[kv_dtype] = m.execute_batch(step, want_logits=True).logits
    finally:
        m.close()
    a, b = logits["float32"], logits["float16"]
    return {"max_abs_diff": float(np.abs(a - b).max()), "max_abs_logit": float(np.abs(a).max()),
            "argmax_kept": f"{int((a.argmax(1) == b.argmax(1)).sum())}/{len(a)}"}


if __name__ == "__main__":
    main()
