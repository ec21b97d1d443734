"""The Llama-like families' batched step (`LlamaBatch`, mixed into `Llama`): the dispatches
of one `execute_batch` step over the paged KV cache of vkrt/models/batch.py (`PagedBatch`:
the cache, the step's device tensors, the checks, bucket capture and replay), and the RoPE
tables it reads.

`batch_step` is `Llama.step`'s arithmetic (vkrt/models/llama.py `_layer`), mostly unfused and
for tokens of several sequences (a residual add and the norm after it are one dispatch,
`add_rmsnorm`): embedding (scaled by hp.embed_scale), per layer RMSNorm,
Q/K/V products (+ biases), the per-head Q/K norms (qk_norm), RoPE of Q and K at each token's
position with K and V written by slot mapping, in one dispatch (`rope_kv_write`, over the
paged RoPE tables: `rope` for positions below max_positions, `rope_swa` for sliding layers,
hp.rope_theta_swa), `attention_paged` (the layer's window), the output product and residual
(or the post-norm, Gemma), RMSNorm, gate/up products, SiLU (or GELU) times up, the down product
and residual; then the logit rows gathered from x, the final RMSNorm, the output product
(slice by slice when the table is split) and `argmax_rows`. Every product over the step's
tokens through `PagedBatch._batch_linear` (each token's row on its role's kernel), the output
product over the logit rows on the "decode" role's kernel (batch invariance:
vkrt/models/batch.py).
"""
from __future__ import annotations

from vkrt.models.batch import PagedBatch, StepInputs, StepShape
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.tensor import Tensor


class LlamaBatch(PagedBatch):
    """`PagedBatch` for the Llama-like families: K/V rows of n_head_kv * head_dim, the RoPE
    tables (`rope`, and `rope_swa` when a layer slides), `batch_step`."""

    def _paged_kv_width(self) -> int:
        return self.hp.n_head_kv * self.hp.head_dim

    def _paged_tables(self, max_positions: int) -> dict[str, Tensor]:
        """RoPE tables (vkrt/models/llama.py `rope_table`) for positions 0 .. max_positions - 1:
        `rope` (rope_theta, rope_scale, rope_freqs), `rope_swa` (rope_theta_swa) when any
        layer slides."""
        from vkrt.models.llama import rope_table

        hp = self.hp
        tables = {"rope": self.stream.upload(rope_table(hp.head_dim, hp.rope_theta,
                                                        max_positions, hp.rope_scale,
                                                        self.rope_freqs), name="paged_rope")}
        if any(hp.swa_layers):
            tables["rope_swa"] = self.stream.upload(rope_table(hp.head_dim, hp.rope_theta_swa,
                                                               max_positions),
                                                    name="paged_rope_swa")
        return tables

    def _batch_activations(self, T: int, R: int):
        """The model's activations, large enough for T tokens and R logit rows (2 at least
        when the output matrix is split, so its `head` exists)."""
        rows = max(R, 1)
        if self._output_name() in self.slices:
            rows = max(rows, 2)
        return self.activations(T, rows)

    def batch_step(self, inputs: StepInputs, shape: StepShape) -> list[Dispatch]:
        """The dispatches of one batched step of `shape` (T tokens, generated tokens' rows
        first, and R logit rows), reading `inputs`' device tensors; nothing is recorded.
        Logits of the R rows land in `acts.logits` rows 0 .. R - 1 and their argmax in
        `inputs.argmax`."""
        hp, k, w = self.hp, self.k, self.w
        T, R = shape.tokens, shape.logits
        a = self._batch_activations(T, R)
        out = self._embed(inputs.ids, a, T)
        if hp.embed_scale != 1.0:
            out.append(k.scale(a.x, T * hp.n_embd, hp.embed_scale, name="token_embd_scale"))
        for i in range(hp.n_layer):
            out += self._batch_layer(i, a, inputs, shape)
        if R == 0:
            return out
        # The logit rows of x, gathered (an f32 "embedding" lookup of x's rows) into proj.
        out.append(k.embed(a.x, inputs.logit_rows, a.proj, R, name="logit_rows"))
        out.append(k.rmsnorm(a.proj, w["output_norm.weight"], a.xn, R, hp.rms_eps,
                             "output_norm"))
        name = self._output_name()
        if name not in self.slices:
            out.append(k.linear(a.xn, w[name], a.logits, R, name="output",
                                **self._role_products("decode")))
        else:
            for row0, wt in self.slices[name]:
                n = wt.shape[0]
                out += [k.linear(a.xn, wt, a.head, R, name="output",
                                 **self._role_products("decode")),
                        k.copy_block(a.head, a.logits, R, n, row0, name="output.copy")]
        out.append(k.argmax_rows(a.logits, inputs.argmax, hp.n_vocab, R, name="argmax"))
        return out

    def _batch_residual(self, i: int, a, T: int, post_norm: str, residual: str,
                        next_norm: str | None) -> list[Dispatch]:
        """x += proj, or x += rmsnorm(proj) * the post-norm (as `Llama._projection`); then
        xn = rmsnorm(x) * `next_norm` (a model weight's name) when given. Without post-norms
        the add and the next norm are one dispatch (`add_rmsnorm`, the same bits)."""
        hp, k, w, blk = self.hp, self.k, self.w, f"blk.{i}."
        if not hp.post_norms:
            if next_norm is None:
                return [k.add(a.x, a.proj, T * hp.n_embd, name=blk + residual)]
            return [k.add_rmsnorm(a.x, a.proj, w[next_norm], a.xn, T, hp.rms_eps,
                                  name=blk + residual + "_norm")]
        out = [k.rmsnorm_add(a.proj, w[blk + post_norm + ".weight"], a.x, T, hp.rms_eps,
                             blk + post_norm)]
        if next_norm is not None:
            out.append(k.rmsnorm(a.x, w[next_norm], a.xn, T, hp.rms_eps,
                                 next_norm.removesuffix(".weight")))
        return out

    def _batch_layer(self, i: int, a, inputs: StepInputs,
                     shape: StepShape) -> list[Dispatch]:
        """Layer i of a batched step: `Llama._layer`'s arithmetic, unfused, with RoPE at each
        token's position, K/V into the paged cache by slot mapping and paged attention."""
        hp, k, w, p, blk = self.hp, self.k, self.w, self._paged, f"blk.{i}."
        T = shape.tokens
        out = []
        if i == 0:   # later layers' attn_norm runs with the residual add before them
            out.append(k.rmsnorm(a.x, w[blk + "attn_norm.weight"], a.xn, T, hp.rms_eps,
                                 blk + "attn_norm"))
        out += [*self._batch_linear(a.xn, blk + "attn_q", a.q, shape),
               *self._batch_linear(a.xn, blk + "attn_k", a.k, shape),
               *self._batch_linear(a.xn, blk + "attn_v", a.v, shape)]
        q, kk = a.q, a.k
        if hp.qk_norm:
            out += [k.rmsnorm(a.q, w[blk + "attn_q_norm.weight"], a.attn, T * hp.n_head,
                              hp.rms_eps, blk + "attn_q_norm"),
                    k.rmsnorm(a.k, w[blk + "attn_k_norm.weight"], a.kn, T * hp.n_head_kv,
                              hp.rms_eps, blk + "attn_k_norm")]
            q, kk = a.attn, a.kn
        rope = p.tables["rope_swa"] if hp.swa_layers[i] else p.tables["rope"]
        out += [
            k.rope_kv_write(q, kk, a.v, rope, inputs.positions, inputs.slots, a.q_rope, p.k[i],
                            p.v[i], T, hp.n_head, hp.n_head_kv, hp.head_dim,
                            name=blk + "rope_kv_write", neox=hp.rope_neox),
            k.attention_paged(a.q_rope, p.k[i], p.v[i], a.attn, inputs.positions, inputs.seq,
                              inputs.tables, T, hp.n_head, hp.n_head_kv, hp.head_dim,
                              p.block_size, self.attn_scale, name=blk + "attn",
                              window=hp.layer_window(i)),
            *self._batch_linear(a.attn, blk + "attn_output", a.proj, shape),
            *self._batch_residual(i, a, T, "post_attention_norm", "attn_residual",
                                  blk + "ffn_norm.weight"),
            *self._batch_glu(a.xn, blk, a.gate, a.up, a.act, shape, hp.n_ff, hp.gelu),
            *self._batch_linear(a.act, blk + "ffn_down", a.proj, shape),
            *self._batch_residual(i, a, T, "post_ffw_norm", "ffn_residual",
                                  f"blk.{i + 1}.attn_norm.weight" if i + 1 < hp.n_layer
                                  else None),
        ]
        return out
