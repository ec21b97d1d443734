"""Serving: an OpenAI-compatible HTTP server (`vkrt serve`) over an engine usable from Python.

`engine.Engine` (the engine loop on its own thread), `scheduler.Scheduler` (FIFO admission,
bounded waiting queue), `request` (SamplingParams, Request, RequestOutput), `protocol` (the
OpenAI wire format), `app.build_app` (the Starlette app). One sequence runs at a time:
batched decode and a paged KV cache are not there yet.
"""
from vkrt.serve.engine import Engine, EngineStoppedError, QueueFullError
from vkrt.serve.request import RequestOutput, SamplingParams

__all__ = ["Engine", "EngineStoppedError", "QueueFullError", "RequestOutput", "SamplingParams"]
