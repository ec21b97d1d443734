"""Serving: an OpenAI-compatible HTTP server (`vkrt serve`) over an engine usable from Python.

`engine.Engine` (the engine loop on its own thread), `scheduler.Scheduler` (continuous
batching: admission, chunked prefill, preemption, a bounded waiting queue), `kv_cache`
(the paged KV cache's block tables), `runner` (`BatchRunner` over a model's `execute_batch`,
`SingleSequenceRunner` for a family without one), `request` (SamplingParams, Request,
Sequence, RequestOutput), `protocol` (the OpenAI wire format), `app.build_app` (the
Starlette app). The names below are imported on first use, so that `vkrt.serve.scheduler`
or `vkrt.serve.kv_cache` alone (the CLI's defaults) does not load numpy and the models.
"""
__all__ = ["Engine", "EngineStoppedError", "QueueFullError", "RequestOutput", "SamplingParams"]


def __getattr__(name):
    if name in ("Engine", "EngineStoppedError", "QueueFullError"):
        from vkrt.serve import engine
        return getattr(engine, name)
    if name in ("RequestOutput", "SamplingParams"):
        from vkrt.serve import request
        return getattr(request, name)
    raise AttributeError(f"module 'vkrt.serve' has no attribute {name!r}")
