"""What every decoder-only model on vkrt shares around its `step` (the forward as a list of
dispatches): recording it on the model's stream (`forward`) and the teacher-forced logits of
one prompt (`logits`). `vkrt.models.generate` drives a model through `hp.n_ctx`, `hp.n_vocab`,
`stream`, `max_seq`, `setup_caches`, `activations` (`ids`, `tokens`, `token`, `logits`),
`forward` and these."""
from __future__ import annotations

import time

import numpy as np

from vkrt.errors import VkrtError


class Decoder:
    """Base of `Llama` and `OPT`: subclasses give `step`, `activations`, `setup_caches`,
    `stream`, `max_seq`."""

    def forward(self, ids, n_tokens: int, pos0: int, all_logits: bool = False,
                token_out=None) -> None:
        """Record `step(...)` on the model's stream (the host time building the list is the
        profiler's "build" phase). Nothing is submitted: read results through the stream."""
        t0 = time.perf_counter_ns()
        step = self.step(ids, n_tokens, pos0, all_logits, token_out)
        self.stream.profiler.add("build", t0)
        self.stream.record(step)

    def weight_tensors(self) -> list:
        """Every tensor holding a weight (`self.w`, name -> Tensor)."""
        return list(self.w.values())

    def weight_bytes(self) -> int:
        """Bytes of the device buffers holding the weights."""
        return sum({t.buffer.serial: t.buffer.nbytes for t in self.weight_tensors()}.values())

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
