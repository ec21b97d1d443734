"""The HTTP side: a Starlette app speaking OpenAI's API in front of one `Engine`.

Routes: POST /v1/completions, POST /v1/chat/completions (`stream` false: one JSON
response; true: server-sent events `data: {chunk}` ending with `data: [DONE]`), GET
/v1/models, GET /health (`Engine.load()`: running and waiting requests, running sequences,
free KV blocks where the cache is paged). Errors are OpenAI's error object
(`protocol.ProtocolError.body`) with status 400 (a bad field, named in `param`; a prompt
past the context or past the whole paged KV cache, before any event is sent), 401 (an
`api_key` was set and the request's `Authorization: Bearer` header does not carry it), 404
(an unknown model or route), 429 (the waiting queue is full), 503 (the engine is shutting
down), 500 (a failure inside the engine).

The event loop never waits for the GPU: the engine thread hands each output over with
`loop.call_soon_threadsafe` into an `asyncio.Queue` per request. A streamed request whose
client goes away is aborted (`Engine.abort`) when Starlette sees the disconnect, so its slot
and KV blocks free within a step; a non-streamed one is checked for a disconnect every second.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from contextlib import asynccontextmanager
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from vkrt.errors import VkrtError
from vkrt.serve import protocol
from vkrt.serve.engine import Engine, EngineStoppedError, RequestError
from vkrt.serve.protocol import ParsedRequest, ProtocolError
from vkrt.serve.request import ABORT, ERROR
from vkrt.serve.scheduler import QueueFullError

DISCONNECT_POLL_S = 1.0
_CANCELLED = object()   # put in an open request's output queue: the server shuts down


def _error(e: ProtocolError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class _EventStream(StreamingResponse):
    """A StreamingResponse that calls `on_close()` however it ends: finished, the client
    gone (Starlette cancels the stream when it receives `http.disconnect`), or the server
    shutting down."""

    def __init__(self, events, on_close: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def build_app(engine: Engine, model_name: str, owns_engine: bool = False,
              api_key: str | None = None) -> Starlette:
    """The app serving `engine`'s model as `model_name` (the id clients send as `model`).
    owns_engine: start the engine when the app starts and shut it down (aborting what is
    left) when the app stops (ASGI lifespan). api_key: every /v1 request must send
    `Authorization: Bearer <api_key>` (else 401, before its body is read; compared in
    constant time); None: no key. /health needs none."""
    created = int(time.time())
    key = None if api_key is None else api_key.encode()
    open_queues: set[asyncio.Queue] = set()     # the output queue of every open request

    def cancel_requests() -> None:
        """On the event loop, at shutdown: every open request ends now (503, or an error
        event and `data: [DONE]`), without waiting for the engine's next step (which may
        be seconds away) to deliver its "abort"."""
        for q in list(open_queues):
            q.put_nowait((None, _CANCELLED))

    def authorize(request: Request) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise ProtocolError("missing or incorrect API key: send 'Authorization: Bearer "
                                "<key>', the key vkrt serve was given (--api-key)",
                                status=401, code="invalid_api_key")

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ProtocolError(f"the model '{name}' does not exist; this server serves "
                                f"'{model_name}' (GET /v1/models)", status=404, param="model",
                                code="model_not_found")

    async def body_of(request: Request):
        raw = await request.body()
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            why = str(e).split("; use sys.set_int_max_str_digits()")[0]   # Python's own hint
            raise ProtocolError(f"the request body is not valid JSON: {why}") from None
        except RecursionError:
            raise ProtocolError("the request body is not valid JSON: nested too deeply") \
                from None

    def context_check(ids: list[int], parsed: ParsedRequest, field: str,
                      param: str | None = None) -> None:
        n_ctx, want = engine.n_ctx, parsed.params.max_tokens
        if not ids:
            raise ProtocolError(f"'{field}': the prompt is empty", param=param or field)
        if len(ids) + (want or 1) > n_ctx:
            extra = f" + max_tokens {want}" if want is not None else ""
            raise ProtocolError(
                f"'{field}': the prompt is {len(ids)} tokens{extra}, past the model's context "
                f"of {n_ctx} tokens", param=param or field, code="context_length_exceeded")

    async def completions(request: Request):
        authorize(request)
        parsed = protocol.parse_completion(await body_of(request))
        check_model(parsed.model)
        held = engine.scheduler.max_queue
        if len(parsed.prompt) > held:
            raise ProtocolError(f"'prompt': {len(parsed.prompt)} prompts, more than the "
                                f"waiting queue holds (--max-queue {held}): each prompt is "
                                "queued as a request", param="prompt")
        prompts = []
        for k, prompt in enumerate(parsed.prompt):
            field = "prompt" if len(parsed.prompt) == 1 else f"prompt[{k}]"
            try:
                ids = engine.encode(prompt)
            except VkrtError as e:
                raise ProtocolError(f"'{field}': {e}", param=field) from None
            context_check(ids, parsed, field)
            prompts.append(ids)
        echoes = None
        if parsed.echo:   # the prompt as given, or its ids' text
            echoes = [p if isinstance(p, str) else engine.decode(ids)
                      for p, ids in zip(parsed.prompt, prompts)]
        return await run(request, parsed, prompts, echoes)

    async def chat(request: Request):
        authorize(request)
        parsed = protocol.parse_chat(await body_of(request))
        check_model(parsed.model)
        try:
            ids = engine.encode_chat(parsed.prompt)
        except VkrtError as e:
            raise ProtocolError(f"'messages': {e}", param="messages") from None
        context_check(ids, parsed, "messages")
        return await run(request, parsed, [ids])

    async def run(request: Request, parsed: ParsedRequest, prompts: list[list[int]],
                  echoes: list[str] | None = None):
        """One engine request per prompt (all or none queued); their outputs, tagged with
        the prompt's index, through one queue (choice index = prompt index * n + the
        sequence's). `echoes`: each prompt's text, which its choices' texts start with."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        queued = []
        load = engine.load() if len(prompts) > 1 else None
        if load and load["waiting"] + len(prompts) > load["max_queue"]:
            raise ProtocolError(f"the server is busy: {load['running']} running and "
                                f"{load['waiting']} waiting, no room for {len(prompts)} more "
                                f"(--max-queue {load['max_queue']}); retry later",
                                status=429, type="rate_limit_error", code="queue_full")

        def abort_all():
            open_queues.discard(outputs)
            for r in queued:
                engine.abort(r.request_id)   # a no-op once it finished

        try:
            for k, ids in enumerate(prompts):
                def sink(out, k=k):   # on the engine thread
                    loop.call_soon_threadsafe(outputs.put_nowait, (k, out))
                rid = parsed.id if len(prompts) == 1 else f"{parsed.id}-{k}"
                queued.append(engine.add_request(ids, parsed.params, sink, request_id=rid))
        except Exception as e:
            abort_all()
            if isinstance(e, QueueFullError):
                raise ProtocolError(str(e), status=429, type="rate_limit_error",
                                    code="queue_full") from None
            if isinstance(e, EngineStoppedError):
                raise ProtocolError(str(e), status=503, type="server_error",
                                    code="shutting_down") from None
            if isinstance(e, RequestError):
                raise ProtocolError(str(e), param=e.param) from None
            if isinstance(e, VkrtError):   # the engine's own context check
                raise ProtocolError(str(e), param="max_tokens") from None
            raise
        open_queues.add(outputs)
        if parsed.stream:
            return _EventStream(events(parsed, outputs, prompts, echoes), abort_all)
        try:
            return await collect(request, parsed, outputs, prompts, echoes)
        finally:
            abort_all()

    async def collect(request: Request, parsed: ParsedRequest, outputs: asyncio.Queue,
                      prompts: list[list[int]], echoes: list[str] | None):
        loop = asyncio.get_running_loop()
        n, left = parsed.params.n, len(prompts)
        choices = n * len(prompts)
        texts = [echoes[i // n] if echoes else "" for i in range(choices)]
        reasons, logprobs = [None] * choices, [[] for _ in range(choices)]
        completion, cached = [0] * len(prompts), [0] * len(prompts)
        checked = loop.time()
        while True:
            try:
                k, out = await asyncio.wait_for(outputs.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                out = None
            if loop.time() - checked >= DISCONNECT_POLL_S:   # idle or not
                checked = loop.time()
                if await request.is_disconnected():
                    raise ProtocolError("the client disconnected", status=499)
            if out is None:
                continue
            if out is not _CANCELLED and out.finish_reason == ERROR and out.request_finished:
                raise ProtocolError(f"generation failed: {out.error}", status=500,
                                    type="server_error")
            if out is _CANCELLED or (out.finish_reason == ABORT and out.request_finished):
                raise ProtocolError("the request was cancelled (server shutting down)",
                                    status=503, type="server_error", code="shutting_down")
            i = k * n + out.index
            texts[i] += out.delta
            logprobs[i] += (out.prompt_logprobs or []) + (out.logprobs or [])
            completion[k], cached[k] = out.completion_tokens, out.cached_tokens
            if out.finished:
                reasons[i] = out.finish_reason
            if out.request_finished:
                left -= 1
                if not left:
                    return JSONResponse(protocol.response(
                        parsed, model_name, texts, reasons, sum(map(len, prompts)),
                        sum(completion), sum(cached), logprobs))

    async def events(parsed: ParsedRequest, outputs: asyncio.Queue, prompts: list[list[int]],
                     echoes: list[str] | None):
        chat_kind, n, left = parsed.kind == "chat", parsed.params.n, len(prompts)
        started = set()
        offsets = [0] * (n * len(prompts))     # text_offset of each choice's next token
        completion, cached = [0] * len(prompts), [0] * len(prompts)
        while left:
            k, out = await outputs.get()
            if out is _CANCELLED or out.finish_reason in (ERROR, ABORT):
                message = (f"generation failed: {out.error}"
                           if out is not _CANCELLED and out.finish_reason == ERROR
                           else "the request was cancelled (server shutting down)")
                yield protocol.sse(ProtocolError(message, 500, "server_error").body())
                yield protocol.sse("[DONE]")   # the stream still ends in order
                return
            completion[k], cached[k] = out.completion_tokens, out.cached_tokens
            i = k * n + out.index
            if chat_kind and i not in started:
                started.add(i)
                yield protocol.sse(protocol.chunk(parsed, model_name, i, "", role=True))
            if echoes and i not in started:   # the prompt first, with its logprobs
                started.add(i)
                lps = protocol.logprobs_json(parsed, out.prompt_logprobs, 0)
                if lps is not None:
                    offsets[i] += sum(len(e.token) for e in out.prompt_logprobs)
                yield protocol.sse(protocol.chunk(parsed, model_name, i, echoes[k],
                                                  logprobs=lps))
            lps = protocol.logprobs_json(parsed, out.logprobs, offsets[i])
            if lps is not None:
                offsets[i] += sum(len(e.token) for e in out.logprobs)
            if out.delta or lps is not None:
                yield protocol.sse(protocol.chunk(parsed, model_name, i, out.delta,
                                                  logprobs=lps))
            if out.finished:
                yield protocol.sse(protocol.chunk(parsed, model_name, i, None,
                                                  out.finish_reason))
            if out.request_finished:
                left -= 1
        if parsed.include_usage:
            yield protocol.sse(protocol.usage_chunk(parsed, model_name, sum(map(len, prompts)),
                                                    sum(completion), sum(cached)))
        yield protocol.sse("[DONE]")

    async def models(request: Request):
        authorize(request)
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "vkrt"}]})

    async def health(request: Request):
        return JSONResponse({"status": "ok", **engine.load()})

    async def protocol_error(request: Request, e: ProtocolError):
        return _error(e)

    async def http_error(request: Request, e: HTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(ProtocolError(f"{request.method} {request.url.path}: {e.detail}",
                                    status=e.status_code, type=kind))

    @asynccontextmanager
    async def lifespan(app):
        if owns_engine:
            engine.start()
        try:
            yield
        finally:
            if owns_engine:
                # Off the event loop: a step in progress finishes first.
                await asyncio.to_thread(engine.shutdown)

    app = Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={ProtocolError: protocol_error, HTTPException: http_error},
        lifespan=lifespan)
    app.router.redirect_slashes = False        # /v1/completions/ is a 404, not a 307
    app.state.cancel_requests = cancel_requests
    return app


CANCEL_GRACE_S = 2.0   # after cancelling: time for the aborted streams to end in order


def server(engine: Engine, app: Starlette, drain_s: float, **config):
    """A uvicorn Server for `app` whose graceful shutdown (SIGINT, SIGTERM) first lets running
    requests finish for `drain_s` seconds, then cancels the engine's requests
    (`Engine.cancel_all`, effective at the engine's next step) and ends every open request at
    once (`build_app`'s `cancel_requests`: a step may take longer than the grace), so that
    every open stream still ends in order (an error event, then `data: [DONE]`) and every
    non-streamed request gets its 503, before uvicorn would cancel the connection tasks
    (CANCEL_GRACE_S later). uvicorn stops accepting at once: a new connection is refused
    from the first signal on. `config`: uvicorn.Config's."""
    import uvicorn

    def cancel():
        engine.cancel_all()
        getattr(app.state, "cancel_requests", lambda: None)()

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets=None):
            timer = asyncio.get_running_loop().call_later(drain_s, cancel)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return DrainingServer(uvicorn.Config(app, timeout_graceful_shutdown=drain_s + CANCEL_GRACE_S,
                                         **config))
