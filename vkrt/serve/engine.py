"""The serving engine: one thread owns the model and its device stream and runs the engine
loop; any thread submits requests and gets their outputs through a callback.

Shaped as vLLM v1 splits it (vllm/v1/engine/core.py: `EngineCore.step` = schedule, execute,
update; vllm/v1/engine/output_processor.py: detokenization and stop strings per request):

    step():  aborts (their KV blocks freed)  -> Scheduler.schedule()  -> runner.submit()
             -> Scheduler.on_submitted()  -> runner.collect() of the step before
             -> Scheduler.update_from_output()  -> per sequence: detokenize, match stop
             strings, emit a RequestOutput, retire what finished (its blocks freed)

Asynchronous scheduling (vLLM v1's `--async-scheduling`; `async_scheduling=True`, the
default): a step whose every sampled token is greedy stays in flight while the engine
schedules and submits the next one, whose decodes take those tokens on the GPU; its outputs
are collected after that submission, so the host's scheduling, input packing and
detokenizing overlap the GPU's step instead of following it. A sequence that step n
finishes (an end-of-generation token, a stop string) has had one more token computed in step
n + 1, which is dropped; max_tokens is known ahead and costs nothing. A step with a sequence
that samples by drawing (temperature > 0) needs its logits on the host first, so it is
collected before the next is scheduled (as with `async_scheduling=False`). The tokens are
the same either way.

A request is `n` sequences (`request.Sequence`), scheduled independently. Where the model
has a batched forward (`execute_batch` over a paged KV cache, vkrt.models.batch: every
family vkrt loads, the Llama-like ones and OPT) the engine batches continuously: every step the scheduler (scheduler.py) admits and retires
sequences and mixes decodes with chunked prefill under a token budget, the KV-cache manager
(kv_cache.py) gives each sequence a block table, and `runner.BatchRunner` flattens the step
into one `BatchInput` and samples each sequence with its own parameters and seeded
generator. A model without one runs one sequence at a time
(`runner.SingleSequenceRunner` over `stream_tokens`, `Scheduler(max_num_seqs=1)`).

Time to first token (TTFT, from arrival) and time per output token (TPOT, the mean after
the first) are measured per request and logged when it finishes.

Python use, without HTTP:

    with vkrt.load(path) as model, Engine(model) as engine:
        for out in engine.generate("Once upon a time", SamplingParams(max_tokens=32)):
            print(out.delta, end="")
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from vkrt.errors import DeviceMemoryError, VkrtError
from vkrt.models.batch import KV_MEMORY_FRACTION
from vkrt.models.generate import check_context
from vkrt.models.scratch import KV_CACHE_DTYPES
from vkrt.serve.kv_cache import (DEFAULT_BLOCK_SIZE, DEFAULT_KV_TOKENS_PER_SEQ, KVCacheManager,
                                 blocks_for)
from vkrt.serve.request import (ABORT, ERROR, STOP, Request, RequestOutput, SamplingParams,
                                Sequence, TokenLogprob)
from vkrt.serve.runner import BatchRunner, SingleSequenceRunner, batched_model
from vkrt.serve.scheduler import (DEFAULT_MAX_BATCH, DEFAULT_MAX_BATCHED_TOKENS, QueueFullError,
                                  Scheduler, SchedulerOutput)

log = logging.getLogger("vkrt.serve")

__all__ = ["Engine", "EngineStoppedError", "QueueFullError", "SamplingParams", "Request",
           "RequestOutput", "StopChecker", "DEFAULT_MAX_BATCH", "DEFAULT_BLOCK_SIZE",
           "DEFAULT_MAX_BATCHED_TOKENS"]




def check_max_batched_tokens(max_batched_tokens, max_batch: int) -> None:
    """Raises VkrtError (one line, in `vkrt serve`'s flag names) unless max_batched_tokens
    (tokens one step computes) is an int of at least max_batch (sequences one step
    decodes), so that every running sequence can decode each step."""
    if not (isinstance(max_batched_tokens, int) and max_batched_tokens >= max_batch):
        raise VkrtError(f"--max-batched-tokens must be at least --max-batch ({max_batch}), "
                        f"so that every running sequence can decode each step; got "
                        f"{max_batched_tokens!r}")


def default_kv_blocks(n_ctx: int, max_batch: int, block_size: int) -> int:
    """KV blocks of the default paged cache: max(n_ctx, max_batch * min(n_ctx,
    DEFAULT_KV_TOKENS_PER_SEQ)) positions, in blocks of block_size (so one sequence can
    always use the whole context, and max_batch moderate ones fit at once)."""
    tokens = max(n_ctx, max_batch * min(n_ctx, DEFAULT_KV_TOKENS_PER_SEQ))
    return blocks_for(tokens, block_size)


# Kept for code that imported the batch-1 runner from here.
ModelRunner = SingleSequenceRunner


class EngineStoppedError(VkrtError):
    """The engine is shutting down (or was never started): no new requests (HTTP 503)."""


class RequestError(VkrtError):
    """A request the engine refuses (HTTP 400): `param` names the field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class StopChecker:
    """Text of one sequence, released as it becomes final. Stop strings are matched on the
    accumulated text, so one that spans several tokens is found (vLLM's StopChecker does the
    same). The last `max(len(stop)) - 1` characters are held back until more text shows they
    cannot start a stop string, so a streamed client never sees text that is later cut, and
    the streamed pieces join to exactly the non-streamed text. The stop string itself is not
    output."""

    def __init__(self, stop: tuple[str, ...]):
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.sent = 0          # characters released

    def add(self, piece: str, final: bool = False) -> tuple[str, bool]:
        """Append `piece`; return (text now released, whether a stop string ended it).
        `final`: no more text comes, release everything held."""
        # A stop string that ends in `piece` starts at most hold characters before it.
        start = max(0, len(self.text) - self.hold)
        self.text += piece
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            final = True
        end = len(self.text) if final else max(self.sent, len(self.text) - self.hold)
        delta, self.sent = self.text[self.sent:end], end
        return delta, bool(hits)


class Engine:
    """The engine loop on its own thread, which alone touches `model` (a `vkrt.Model`) once
    `start()` ran. `add_request`, `abort`, `pause`, `resume` and `shutdown` may be called from
    any thread; outputs reach each request's `sink` on the engine thread.

    max_queue: requests that may wait with no sequence admitted (`Scheduler`). `stats`:
    counters (requests finished, aborted, tokens generated). Use as a context manager
    (start, then shutdown) or call `start()` and `shutdown()`.

    Where the model has a batched forward (`execute_batch` on `model.lm` or the model:
    `runner.BatchRunner`) the engine batches continuously: max_batch sequences per step at
    most (None: DEFAULT_MAX_BATCH), max_batched_tokens tokens per step (decodes plus prefill
    chunks, >= max_batch; None: DEFAULT_MAX_BATCHED_TOKENS or max_batch if larger), a paged
    KV cache of kv_blocks blocks of block_size token slots (None: `default_kv_blocks`, room
    for max_batch sequences of min(n_ctx, DEFAULT_KV_TOKENS_PER_SEQ) positions and for one
    of the whole context, or as many blocks as the device holds where fewer:
    `max_paged_blocks` of the model; DEFAULT_BLOCK_SIZE) of kv_cache_dtype elements ("f32",
    or "f16": K and V rounded to f16 as they are stored, half the bytes; `KV_CACHE_DTYPES`),
    allocated here, so a cache that does not fit raises VkrtError now rather than failing
    every request. async_scheduling: a greedy step stays in flight while the next is
    scheduled (the module docstring). prefix_caching: full prompt blocks stay cached for
    later prompts that start with the same tokens (kv_cache.py; the tokens are the same
    either way). Without one it runs one sequence at a time
    (`runner.SingleSequenceRunner`); max_batch must then be None or 1, the other three None
    and kv_cache_dtype "f32" (prefix_caching has nothing to cache there). Raises VkrtError for a value out of range or a KV
    cache that cannot be allocated."""

    def __init__(self, model, max_queue: int = 16, max_batch: int | None = None,
                 kv_blocks: int | None = None, block_size: int | None = None,
                 max_batched_tokens: int | None = None, kv_cache_dtype: str = "f32",
                 async_scheduling: bool = True, prefix_caching: bool = True):
        self.model = model
        self.async_scheduling = bool(async_scheduling)
        self._in_flight = None      # the submitted step not collected yet (RunnerStep)
        lm = batched_model(model)
        self.kv: KVCacheManager | None = None
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_capped_from: int | None = None   # the default's blocks, where the device held fewer
        if lm is None:
            if (max_batch not in (None, 1) or kv_blocks is not None or block_size is not None
                    or max_batched_tokens is not None or kv_cache_dtype != "f32"):
                raise VkrtError(f"the {getattr(model, 'family', 'model')} family has no "
                                "batched forward (execute_batch): it runs one sequence at a "
                                "time, so --max-batch must be 1 and --kv-blocks, --block-size, "
                                "--max-batched-tokens and --kv-cache-dtype are not used")
            self.max_batch = 1
            self.scheduler = Scheduler(max_queue)
            self.runner = SingleSequenceRunner(model)
        else:
            self.max_batch = DEFAULT_MAX_BATCH if max_batch is None else max_batch
            if not (isinstance(self.max_batch, int) and self.max_batch >= 1):
                raise VkrtError(f"--max-batch must be an integer >= 1, got {max_batch!r}")
            block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
            if kv_cache_dtype not in KV_CACHE_DTYPES:
                raise VkrtError(f"--kv-cache-dtype must be one of "
                                f"{', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
            kv_dtype = KV_CACHE_DTYPES[kv_cache_dtype]
            fit = None
            if isinstance(block_size, int) and block_size >= 1:
                fit = lm.max_paged_blocks(block_size, kv_dtype)
                have = lm.paged_cache_info
                if have is not None and have[1] == block_size and lm.paged_kv_dtype == kv_dtype:
                    fit = max(fit, have[0])   # the model's cache fits: it is there
                if kv_blocks is None:
                    if fit < 1:
                        raise VkrtError(f"no KV block of {block_size} token slots fits in the "
                                        "device memory the weights leave (--block-size)")
                    want = default_kv_blocks(model.hparams.n_ctx, self.max_batch, block_size)
                    kv_blocks = min(want, fit)
                    if kv_blocks < want:
                        self.kv_capped_from = want
            self.kv = KVCacheManager(kv_blocks, block_size, prefix_caching)
            if max_batched_tokens is None:
                max_batched_tokens = max(DEFAULT_MAX_BATCHED_TOKENS, self.max_batch)
            else:
                check_max_batched_tokens(max_batched_tokens, self.max_batch)
            self.scheduler = Scheduler(max_queue, self.max_batch, max_batched_tokens, self.kv)
            self.runner = BatchRunner(lm, self.kv, model.tokenizer.eog_ids, kv_dtype,
                                      self.max_batch)
            try:   # now, so that a cache that does not fit fails here, not every request
                self.runner.setup_cache()
            except (ValueError, DeviceMemoryError) as e:
                hint = (f"; {fit} blocks fit in {KV_MEMORY_FRACTION:.0%} of this device's "
                        "memory, the default's bound (--kv-blocks)"
                        if fit is not None and kv_blocks > fit else "")
                why = str(e).removeprefix("setup_paged_cache: ")
                raise VkrtError(f"the paged KV cache ({kv_blocks} blocks of {block_size} token "
                                f"slots, {kv_cache_dtype}) cannot be allocated: {why}"
                                f"{hint}") from None
        self._cond = threading.Condition()
        # The tokenizer is one `tokenizers.Tokenizer` shared by the threads that encode
        # prompts and the engine thread that detokenizes; `Tokenizer.encode` flips its
        # `encode_special_tokens` setting, so uses are serialized (each takes microseconds
        # to milliseconds, never a GPU wait).
        self._tokenizer_lock = threading.Lock()
        self._requests: dict[str, Request] = {}
        self._texts: dict[Sequence, Any] = {}       # (detokenizer, StopChecker) per sequence
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._paused = False
        self.stats = {"finished": 0, "aborted": 0, "tokens": 0}

    # -- any thread -----------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self.model.hparams.n_ctx

    def encode(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a raw prompt (`Model.encode`). Raises VkrtError (an id outside the
        vocabulary, text that is not UTF-8)."""
        with self._tokenizer_lock:
            return self.model.encode(prompt)

    def decode(self, ids: list[int]) -> str:
        """The text of prompt token ids (special tokens spelled out, as `Tokenizer.decode`)."""
        with self._tokenizer_lock:
            return self.model.tokenizer.decode(list(ids))

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` through the model's chat template, ending with the opening
        of an assistant turn (`vkrt.models.chat.encode_chat`). Raises VkrtError when the model
        has no chat template or the template fails."""
        from vkrt.models.chat import encode_chat

        template = self.model.checkpoint.chat_template
        if not template:
            raise VkrtError("the model has no chat template: use /v1/completions")
        tok = self.model.tokenizer

        def text(i):
            return "" if i is None else tok.decode([i])

        with self._tokenizer_lock:
            return encode_chat(tok, template, messages, add_generation_prompt=True,
                               bos_token=text(tok.bos_id), eos_token=text(tok.eos_id))

    def add_request(self, prompt_ids: list[int], params: SamplingParams,
                    sink: Callable[[RequestOutput], None],
                    request_id: str | None = None) -> Request:
        """Queue a request for `prompt_ids` (token ids). `params.max_tokens` None becomes the
        rest of the context (at most what the whole paged KV cache holds). Returns the
        Request (its `request_id` for `abort`).
        Raises VkrtError when the prompt is empty or prompt + max_tokens exceeds the context
        (`check_context`) or one sequence needs more KV blocks than the cache has,
        RequestError (naming the field) for logprobs, penalties or a logit bias asked of a
        model without a batched forward or a logit_bias id past the vocabulary,
        QueueFullError when
        max_queue requests wait already, EngineStoppedError after shutdown."""
        ids = list(prompt_ids)
        if self.kv is None:   # the batch-1 runner samples on `generate`'s token loop
            for field, used in (("logprobs", params.logprobs is not None),
                                ("prompt_logprobs", params.prompt_logprobs is not None),
                                ("presence_penalty", params.presence_penalty != 0),
                                ("frequency_penalty", params.frequency_penalty != 0),
                                ("repetition_penalty", params.repetition_penalty != 1),
                                ("logit_bias", bool(params.logit_bias))):
                if used:
                    raise RequestError(
                        f"{field} needs a model with a batched forward (execute_batch); the "
                        f"{getattr(self.model, 'family', 'model')} family has none", field)
        n_vocab = self.model.hparams.n_vocab
        bad = [i for i, _ in params.logit_bias if i >= n_vocab]
        if bad:
            raise RequestError(f"logit_bias: token id {bad[0]} is past the vocabulary of "
                               f"{n_vocab}", "logit_bias")
        max_tokens = params.max_tokens
        if max_tokens is None:     # the rest of the context, or of what the KV cache holds
            limit = self.n_ctx
            if self.kv is not None:
                limit = min(limit, self.kv.num_blocks * self.kv.block_size + 1)
            max_tokens = max(1, limit - len(ids))
            params = dataclasses.replace(params, max_tokens=max_tokens)
        check_context(self.n_ctx, len(ids), max_tokens)
        # (The scheduler also refuses, with VkrtError, a sequence the whole KV cache cannot
        # hold.)
        request = Request(request_id or uuid.uuid4().hex, ids, params, sink)
        with self._cond:
            if self._stopping or self._thread is None:
                raise EngineStoppedError("the engine is not running (shutting down)")
            self.scheduler.add_request(request)
            self._requests[request.request_id] = request
            self._cond.notify_all()
        return request

    def generate(self, prompt: str | list[int],
                 params: SamplingParams = SamplingParams()) -> Iterator[RequestOutput]:
        """Submit `prompt` (text is encoded raw) and yield its outputs as they come, on the
        calling thread. Closing the iterator early aborts the request. Raises as
        `add_request`."""
        box: queue.SimpleQueue = queue.SimpleQueue()
        request = self.add_request(self.encode(prompt), params, box.put)
        done = False
        try:
            while not done:
                try:   # in slices, so that Ctrl-C (KeyboardInterrupt) reaches the caller
                    out = box.get(timeout=0.05)
                except queue.Empty:
                    continue
                done = out.request_finished
                yield out
        finally:
            if not done:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        """Cancel a request: it is retired at the start of the next step (its slot freed, a
        last output with finish_reason "abort" sent). Unknown or finished ids are ignored."""
        with self._cond:
            request = self._requests.get(request_id)
            if request is not None:
                request.abort_requested = True
                self._cond.notify_all()

    def pause(self) -> None:
        """Stop scheduling after the current step: running requests hold their slot and new
        ones wait in the queue (aborts are still processed). `resume()` goes on."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def load(self) -> dict:
        """The scheduler's occupancy now: {"running", "waiting"} (requests), "running_seqs",
        "max_queue", "max_batch", and with a paged KV cache "kv_blocks", "kv_free_blocks",
        "kv_cached_blocks" (prefix caching: cached blocks, in tables or free) and
        "prefix_cache_hit_tokens" (prompt positions taken from the cache so far)."""
        with self._cond:
            s = self.scheduler
            out = {"running": s.num_running_requests(), "waiting": s.num_waiting_requests(),
                   "running_seqs": len(s.running), "max_queue": s.max_queue,
                   "max_batch": self.max_batch}
            if self.kv is not None:
                out.update(kv_blocks=self.kv.num_blocks, kv_free_blocks=self.kv.num_free_blocks,
                           kv_cached_blocks=self.kv.num_cached_blocks,
                           prefix_cache_hit_tokens=self.kv.num_hit_tokens)
            return out

    def start(self, thread: bool = True) -> "Engine":
        """Start the engine thread (from then on only it touches the model). thread=False:
        accept requests without a thread; the caller runs `step()` itself (tests, or an
        outer loop that owns the model). Raises VkrtError when another started engine runs
        the same model (one at a time: `runner.BatchRunner.activate`)."""
        with self._cond:
            if self._thread is None:
                self.runner.activate()
            if not thread:
                self._thread = self._thread or threading.current_thread()
            elif self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="vkrt-engine",
                                                daemon=True)
                self._thread.start()
        return self

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new requests, abort every waiting and running one (each gets its "abort"
        output), and join the engine thread (`timeout` seconds at most, None: until it
        ends; a step in progress finishes first)."""
        self.cancel_all()
        with self._cond:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            self._drop_in_flight()
            self.runner.deactivate()     # another engine may run the model now

    def _drop_in_flight(self) -> None:
        """Wait for the step still in flight, if any, and drop its tokens (the engine stops
        without stepping again: `start(thread=False)`; the engine thread collects it)."""
        step, self._in_flight = self._in_flight, None
        if step is not None:
            try:
                self.runner.collect(step)
            except Exception:
                log.exception("the step in flight at shutdown failed")

    def cancel_all(self) -> None:
        """Refuse new requests (EngineStoppedError) and abort every waiting and running one:
        each gets its "abort" output at the start of the next step. Does not wait (safe on an
        event loop)."""
        with self._cond:
            self._stopping = True
            for request in self._requests.values():
                request.abort_requested = True
            self._cond.notify_all()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- the engine thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._has_work():
                    if self._stopping:
                        self.runner.deactivate()
                        return
                    self._cond.wait()
            self.step()

    def has_unfinished(self) -> bool:
        """Requests wait or run, or a step is still in flight. Under `start(thread=False)`
        the caller steps until it is False: `while engine.has_unfinished(): engine.step()`."""
        return self._in_flight is not None or self.scheduler.has_unfinished()

    def _has_work(self) -> bool:
        s = self.scheduler
        if self._in_flight is not None:
            return True
        if any(q.request.abort_requested for q in (*s.running, *s.waiting)):
            return True
        return not self._paused and s.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One engine step (engine thread only): retire aborted requests (their KV blocks go
        back to the pool before this step schedules), schedule and submit the step's tokens
        of every scheduled sequence, collect the step before it (asynchronous scheduling)
        or this one, detokenize and check stop strings, emit outputs, retire what finished.
        Returns the outputs it sent."""
        outputs: list[tuple[Request, RequestOutput]] = []
        with self._cond:
            aborted = {id(q.request): q.request
                       for q in (*self.scheduler.running, *self.scheduler.waiting)
                       if q.request.abort_requested}
            for request in aborted.values():
                outputs.append((request, self._retire(request, ABORT)))
            plan = SchedulerOutput() if self._paused else self.scheduler.schedule()
        step = None
        if plan.scheduled:
            try:
                for seq in plan.seqs:
                    if not self.runner.running(seq):
                        self._start_sequence(seq)
                step = self.runner.submit(plan)
            except Exception as e:   # a failure inside the model: fail the requests, go on
                outputs += self._fail(plan, e)
            else:
                with self._cond:
                    self.scheduler.on_submitted(plan)
        previous, self._in_flight = self._in_flight, None
        if previous is not None:
            outputs += self._collect(previous)
        if step is not None:
            if step.overlaps and self.async_scheduling:
                self._in_flight = step
            else:
                outputs += self._collect(step)
        for request, out in outputs:
            try:
                request.sink(out)
            except Exception:   # a consumer's failure must not stop the engine
                log.exception("request %s: output callback failed", request.request_id)
        return [out for _, out in outputs]

    def _fail(self, plan: SchedulerOutput, e: Exception) -> list[tuple[Request, RequestOutput]]:
        """Retire the requests of `plan`'s sequences with an "error" output naming `e`."""
        log.exception("engine step failed")
        outputs = []
        with self._cond:
            if self.kv is not None:
                # The blocks the step was to fill may hold nothing: no later prompt takes them.
                self.kv.reset_prefix_cache()
            failed = {id(q.request): q.request for q in plan.seqs}
            for request in failed.values():
                if request.finished:
                    continue
                out = self._retire(request, ERROR)
                out.error = f"{type(e).__name__}: {e}"
                outputs.append((request, out))
        return outputs

    def _collect(self, step) -> list[tuple[Request, RequestOutput]]:
        """Wait for a submitted step and fold its tokens into their sequences (the runner
        gives none for a sequence released since: a token computed after its sequence
        stopped is dropped)."""
        try:
            results = self.runner.collect(step)
        except Exception as e:
            return self._fail(step.plan, e)
        with self._cond:
            self.scheduler.update_from_output(step.plan,
                                              {q: s.token for q, s in results.items()})
        return [(seq.request, self._update(seq, s.token, s.finish_reason, s.logprobs,
                                           s.prompt_logprobs))
                for seq, s in results.items()]

    def _start_sequence(self, seq: Sequence) -> None:
        self.runner.start(seq)
        detok = self.model.tokenizer.stream(skip_special=True)
        self._texts[seq] = (detok, StopChecker(seq.request.params.stop))

    def _update(self, seq: Sequence, token: int, reason: str | None,
                logprobs=None, prompt_logprobs=None) -> RequestOutput:
        """Fold one new token of `seq` into its text (and its log-probabilities and its
        prompt's, `Sampled`'s, into `TokenLogprob`s with the ids' texts); retire the
        sequence (and the request after its last) when it stopped."""
        request = seq.request
        now = time.perf_counter()
        if request.first_token_at is None:
            request.first_token_at = now
        request.last_token_at = now
        request.completion_tokens += 1
        self.stats["tokens"] += 1
        detok, checker = self._texts[seq]
        with self._tokenizer_lock:
            piece = detok.step(token)
            if reason is not None:
                piece += detok.finish()
            if logprobs is not None:
                logprobs = [self._token_logprob(token, *logprobs)]
            if prompt_logprobs is not None:
                first = seq.token_ids[0]
                prompt_logprobs = [self._token_logprob(first, None, ())] + [
                    self._token_logprob(t, *e) for t, e in zip(
                        seq.token_ids[1:seq.num_prompt_tokens], prompt_logprobs)]
        delta, stopped = checker.add(piece, final=reason is not None)
        if stopped:
            reason = STOP
        out = RequestOutput(request.request_id, seq.index, delta, [token],
                            prompt_tokens=len(request.prompt_ids),
                            completion_tokens=request.completion_tokens,
                            cached_tokens=request.cached_tokens, logprobs=logprobs,
                            prompt_logprobs=prompt_logprobs)
        if reason is None:
            return out
        out.finished, out.finish_reason = True, reason
        self.runner.release(seq)
        del self._texts[seq]
        with self._cond:
            self.scheduler.finish_seq(seq)      # its KV blocks are free for the next step
            if not request.finished:
                return out
            last = self._retire(request, reason)
        out.request_finished, out.ttft_s, out.tpot_s = True, last.ttft_s, last.tpot_s
        return out

    def _token_logprob(self, token: int, logprob: float | None, top) -> TokenLogprob:
        """A `TokenLogprob` with the texts of `token` and of the `top` (id, logprob) ids,
        each id decoded alone (as a generated token: a SentencePiece token keeps its leading
        space; an id holding part of a UTF-8 character decodes to U+FFFD)."""
        def text(i: int) -> str:
            return self.model.tokenizer.decode([i], continuation=True)
        return TokenLogprob(token, text(token), logprob, tuple((i, text(i), v) for i, v in top))

    def _retire(self, request: Request, reason: str) -> RequestOutput:
        """Under the lock: free the request's sequences (their KV blocks) and state; its
        last output."""
        self.scheduler.finish_request(request)
        for seq in request.seqs:
            self.runner.release(seq)
            self._texts.pop(seq, None)
        self._requests.pop(request.request_id, None)
        self.stats["aborted" if reason == ABORT else "finished"] += 1
        ttft = tpot = None
        if request.first_token_at is not None:
            ttft = request.first_token_at - request.arrival
            if request.completion_tokens > 1:
                tpot = ((request.last_token_at - request.first_token_at)
                        / (request.completion_tokens - 1))
        log.info("request %s: %s, prompt %d tokens, completion %d tokens, TTFT %s, TPOT %s",
                 request.request_id, reason, len(request.prompt_ids),
                 request.completion_tokens,
                 "-" if ttft is None else f"{ttft * 1e3:.1f} ms",
                 "-" if tpot is None else f"{tpot * 1e3:.1f} ms")
        index = max((q.index for q in request.seqs), default=0)
        return RequestOutput(request.request_id, index, "", [], True, reason, True,
                             len(request.prompt_ids), request.completion_tokens,
                             ttft_s=ttft, tpot_s=tpot, cached_tokens=request.cached_tokens)
