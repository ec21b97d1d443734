"""Memory a model load costs: device bytes for the weights against the GGUF's tensor bytes,
and the process's peak resident memory against the file's size.

    python bench/load_memory.py [--model PATH] [--device N]

Run it in a fresh process (peak RSS is the process's maximum since it started: `ru_maxrss`
of `resource.getrusage`, KiB on Linux). Prints one JSON object: the file's size and tensor
bytes, the weight arena's device bytes (allocation sizes) and buffer count, and the peak
RSS after imports and device creation (`rss_before_load`) and after `Llama.from_gguf` and
`GGUFFile.close` (`rss_peak_after_load`), with `load_rss_delta` the difference: what the
load itself added. On a CPU device (lavapipe) device memory is process memory, so the
weights themselves count in RSS there; on a discrete GPU they do not.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time


def peak_rss() -> int:
    """Bytes: the process's peak resident set so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", type=int, default=None)
    args = ap.parse_args()

    from vkrt.models.default_model import find_default_model
    from vkrt.models.gguf import load_gguf
    from vkrt.models.llama import Llama
    from vkrt.runtime.device import Device

    path = args.model or find_default_model()
    with Device(args.device) as device:
        gguf = load_gguf(path)
        before = peak_rss()
        t0 = time.perf_counter()
        model = Llama.from_gguf(device, gguf)
        model.stream.synchronize()
        load_s = time.perf_counter() - t0
        gguf.close()
        after = peak_rss()
        file_size = os.path.getsize(path)
        tensor_bytes = sum(gguf.tensor_info(n).nbytes for n in gguf.tensor_names)
        types: dict[str, int] = {}
        for n in gguf.tensor_names:
            types[gguf.tensor_info(n).ggml_type] = types.get(gguf.tensor_info(n).ggml_type, 0) + 1
        print(json.dumps({
            "model": path, "device": device.name, "tensor_types": types,
            "file_bytes": file_size, "gguf_tensor_bytes": tensor_bytes,
            "device_weight_bytes": model.arena.nbytes,
            "device_weight_buffers": len(model.arena.buffers),
            "weights_over_tensor_bytes": round(model.arena.nbytes / tensor_bytes, 4),
            "rss_before_load": before, "rss_peak_after_load": after,
            "load_rss_delta": after - before,
            "peak_rss_over_file": round(after / file_size, 3),
            "load_delta_over_file": round((after - before) / file_size, 3),
            "load_s": round(load_s, 2)}, indent=1))
        model.close()


if __name__ == "__main__":
    main()
