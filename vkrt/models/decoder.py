"""What every decoder-only model on vkrt shares around its `step` (the forward as a list of
dispatches): recording it on the model's stream (`forward`) and the teacher-forced logits of
one prompt (`logits`). `vkrt.models.generate` drives a model through `hp.n_ctx`, `hp.n_vocab`,
`stream`, `max_seq`, `setup_caches`, `activations` (`ids`, `tokens`, `token`, `logits`),
`forward` and these."""
from __future__ import annotations

import time

import numpy as np

from vkrt import config
from vkrt.errors import VkrtError


class Decoder:
    """Base of `Llama` and `OPT`: subclasses give `step`, `activations`, `setup_caches`,
    `stream`, `max_seq`. A family whose `step` takes `pos=` (a [1] u32 position buffer) and
    whose activations hold `pos` sets `replayable` and gets decode replay."""

    replayable = False
    # The KV cache's element dtype: float32, or float16 (K and V rounded to f16 as they are
    # stored, half the bytes; the `_kvf16` kernels, vkrt/glsl/kv.glsl). `setup_caches` reads
    # it; `vkrt.load(kv_cache_dtype=...)` sets it.
    kv_dtype = "float32"
    _replays: dict | None = None   # (stream serial, ring phase) -> Recording

    def forward(self, ids, n_tokens: int, pos0: int, all_logits: bool = False,
                token_out=None) -> None:
        """Record `step(...)` on the model's stream (the host time building the list is the
        profiler's "build" phase). One token is recorded and not submitted; more (a prefill)
        are submitted every `config.PREFILL_FLUSH` records but the last ones, so the GPU
        starts while the host records. Read results through the stream."""
        t0 = time.perf_counter_ns()
        step = self.step(ids, n_tokens, pos0, all_logits, token_out)
        self.stream.profiler.add("build", t0)
        self.stream.record(step, flush_every=config.PREFILL_FLUSH.value if n_tokens > 1 else 0)

    # -- decode replay (vkrt/runtime/replay.py) ---------------------------------------------
    def set_position(self, position: int) -> None:
        """Where the next replayed decode step runs: write `position` into `acts.pos` (each
        replay advances it by one on the GPU). Raises ValueError past the KV cache."""
        if not 0 <= position < self.max_seq:
            raise ValueError(f"position {position} is outside the KV cache of {self.max_seq} "
                             "tokens (setup_caches)")
        self.stream.write(self.acts.pos, np.array([position], np.uint32))

    def replay_decode(self, step: int):
        """Submit decode step number `step` of the greedy loop as a replay and return the
        `Readback` of its token: ring phase j = step % len(ring) reads token slot j - 1 and
        writes slot j, at the position in `acts.pos`, which it then advances. The step is
        captured on first use per phase and captured again when the activations, the KV
        cache, the token ring, the barrier policy, VKRT_FUSE or the stream changed. The
        caller keeps the positions inside the KV cache (`set_position` checks the first)."""
        a, s = self.acts, self.stream
        ring = a.tokens
        phase = step % len(ring)
        key = (a.arena.serial, self.kv.serial, self.max_seq, len(ring), s.tracker.always,
               config.FUSE.value)
        if self._replays is None:
            self._replays = {}
        rec = self._replays.get((s.serial, phase))
        if rec is None or rec.key != key:
            if rec is not None:
                s.drop(rec)
            t0 = time.perf_counter_ns()
            records = self.step(ring[(phase - 1) % len(ring)], 1, 0, token_out=ring[phase],
                                pos=a.pos) + [self.k.advance_pos(a.pos, 1)]
            s.profiler.add("build", t0)
            rec = s.capture(records, readback=ring[phase], key=key)
            self._replays[(s.serial, phase)] = rec
        return s.replay(rec, ring[phase])

    def weight_tensors(self) -> list:
        """Every tensor holding a weight (`self.w`, name -> Tensor)."""
        return list(self.w.values())

    def weight_bytes(self) -> int:
        """Bytes of the device buffers holding the weights."""
        return sum({t.buffer.serial: t.buffer.nbytes for t in self.weight_tensors()}.values())

    def row_tables(self) -> list:
        """Weight tensors of which a decode step reads one row only (an input embedding
        that is not also the output matrix, learned positions); families override it."""
        return []

    def decode_weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (as stored): every weight tensor once but
        the `row_tables`, of which it reads one row (counted as none). Times decode tok/s
        this is the weight bandwidth `vkrt bench` reports."""
        skip = {t.key for t in self.row_tables()}
        views = {t.key: t.nbytes for t in self.weight_tensors() if t.key not in skip}
        return sum(views.values())

    def logits(self, token_ids: list[int]) -> np.ndarray:
        """Teacher-forced logits `[len(token_ids), n_vocab]` f32 of one forward from position 0.
        Raises VkrtError for an empty list."""
        if len(token_ids) == 0:
            raise VkrtError("the prompt is empty: nothing to condition on")
        T = len(token_ids)
        if self.max_seq < T:
            self.setup_caches(T)
        a = self.activations(T, T)
        self.stream.write(a.ids, np.asarray(token_ids, np.uint32))
        self.forward(a.ids, T, 0, all_logits=True)
        return self.stream.read(a.logits.rows(0, T))
