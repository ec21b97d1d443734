"""Chrome trace event files (the JSON "Trace Event Format" that Perfetto and chrome://tracing
open): host phases on one track, GPU records on another, on one clock.

Events are complete events (`"ph": "X"`) with `ts` and `dur` in microseconds, process 1,
thread 1 "host" and thread 2 "gpu" (named by `"ph": "M"` metadata events). GPU times come
from timestamp queries mapped onto the host clock (`Timestamps.collect`, timestamps.py): with
VK_EXT_calibrated_timestamps by a device/CLOCK_MONOTONIC pair sampled when each batch's
timestamps are collected; without it, each batch's first timestamp is aligned to its submit
time (or to the end of the previous batch, if that is later). `otherData.calibration` says
which.
"""
from __future__ import annotations

import json

HOST_TID, GPU_TID = 1, 2


def write_chrome_trace(path, profiler, device_name: str, calibration: str) -> dict:
    """Write `profiler.events` (host) and `profiler.gpu_events` (GPU) to `path`; return the
    object written. Times are relative to the earliest event."""
    host = profiler.events or []
    gpu = profiler.gpu_events or []
    origin = min([s for _, s, _ in host] + [s for _, s, _ in gpu] + [0 if not (host or gpu)
                                                                     else float("inf")])
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"vkrt ({device_name})"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": HOST_TID, "args": {"name": "host"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": GPU_TID, "args": {"name": "gpu"}},
    ]
    for tid, cat, rows in ((HOST_TID, "host", host), (GPU_TID, "gpu", gpu)):
        for name, start, end in rows:
            events.append({"name": name, "cat": cat, "ph": "X", "pid": 1, "tid": tid,
                           "ts": round((start - origin) / 1e3, 3),
                           "dur": round(max(end - start, 0) / 1e3, 3)})
    out = {"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"device": device_name, "calibration": calibration,
                         "host_events": len(host), "gpu_events": len(gpu)}}
    with open(path, "w") as f:
        json.dump(out, f)
    return out
