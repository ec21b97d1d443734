"""OPT's batched step (`OPTBatch`, mixed into `OPT`): the dispatches of one `execute_batch`
step over the paged KV cache of vkrt/models/batch.py (`PagedBatch`: the cache, the step's
device tensors, the checks, bucket capture and replay), and the learned-position table it
reads.

`batch_step` is `OPT.step`'s arithmetic (vkrt/models/opt.py, after transformers'
models/opt/modeling_opt.py `OPTDecoder.forward`, `OPTDecoderLayer.forward`) for tokens of
several sequences, each at its own position p:
- x = project_in(embed_tokens[id]) + embed_positions[p + 2]: the learned positions
  (`OPTLearnedPositionalEmbedding`, offset 2) are uploaded once per paged cache as their own
  table, rows 2 .. 2 + max_positions - 1 of embed_positions (`positions`, row p is position
  p), and gathered by each token's position (`embed` of the positions tensor, then `add`);
- per layer, pre-LayerNorm (do_layer_norm_before) or post-LayerNorm (opt-350m) as
  `OPT._attention_block` / `_mlp_block`: Q/K/V products + biases, K and V written by slot
  mapping (`kv_write`), `attention_paged` (every head its own K/V head; the scale
  head_dim^-0.5 on q, `OPTAttention.scaling`, inside the kernel as in the single-sequence
  forward), out_proj + bias + residual; fc1 + bias, ReLU, fc2 + bias + residual;
- the logit rows gathered from x, final_layer_norm (when the model has it), project_out
  (when word_embed_proj_dim != hidden_size), the logits over lm_head's slices (tied to
  embed_tokens) and `argmax_rows`.
Every product over the step's tokens through `PagedBatch._batch_linear` (each token's row on
its role's kernel), every product over the logit rows on the "decode" role's kernel,
LayerNorm one row per workgroup (batch invariance: vkrt/models/batch.py). Dispatches are
named after transformers' parameters, as
`OPT.step`'s. Positions run below min(max_position_embeddings, num_blocks * block_size):
`validate_batch` refuses a position at or past it.
"""
from __future__ import annotations

from vkrt.models.batch import PagedBatch, StepInputs, StepShape
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.tensor import Tensor


class OPTBatch(PagedBatch):
    """`PagedBatch` for OPT: K/V rows of n_embd (n_head heads of head_dim), the learned
    positions from offset 2 (`positions`), `batch_step`."""

    def _paged_kv_width(self) -> int:
        return self.hp.n_embd

    @staticmethod
    def _paged_kv_name(i: int, what: str) -> str:
        return f"decoder.layers.{i}.self_attn.paged_{what}"

    def _paged_tables(self, max_positions: int) -> dict[str, Tensor]:
        """`positions`: f32 [max_positions, n_embd], row p = embed_positions[p + 2] (the
        learned table read back once and its rows from the offset uploaded)."""
        from vkrt.models.opt import POSITION_OFFSET

        table = self.stream.read(self.w["decoder.embed_positions.weight"])
        rows = table[POSITION_OFFSET:POSITION_OFFSET + max_positions]
        return {"positions": self.stream.upload(rows.copy(), name="paged_positions")}

    def _batch_activations(self, T: int, R: int):
        """The model's activations for T tokens and R logit rows (2 at least when lm_head is
        in several slices, so its `head` exists)."""
        rows = max(R, 1)
        if len(self.head) > 1:
            rows = max(rows, 2)
        return self.activations(T, rows)

    def _batch_embed(self, inputs: StepInputs, a, shape: StepShape) -> list[Dispatch]:
        """x = project_in(embed_tokens[ids]) + the learned position of each token."""
        hp, k, p, T = self.hp, self.k, self._paged, shape.tokens
        dst = a.emb if hp.n_proj != hp.n_embd else a.x
        if len(self.embed) == 1:
            out = [k.embed(self.embed[0][1], inputs.ids, dst, T, name="decoder.embed_tokens")]
        else:
            out = [k.embed_range(table, row0, inputs.ids, dst, T, name="decoder.embed_tokens")
                   for row0, table in self.embed]
        if hp.n_proj != hp.n_embd:
            out += self._batch_linear(a.emb, "decoder.project_in", a.x, shape)
        out += [k.embed(p.tables["positions"], inputs.positions, a.proj, T,
                        name="decoder.embed_positions"),
                k.add(a.x, a.proj, T * hp.n_embd, name="decoder.embed_positions.add")]
        return out

    def batch_step(self, inputs: StepInputs, shape: StepShape) -> list[Dispatch]:
        """The dispatches of one batched step of `shape` (T tokens, generated tokens' rows
        first, and R logit rows), reading `inputs`' device tensors; nothing is recorded.
        Logits of the R rows land in `acts.logits` rows 0 .. R - 1 and their argmax in
        `inputs.argmax`."""
        hp, k, w = self.hp, self.k, self.w
        T, R = shape.tokens, shape.logits
        a = self._batch_activations(T, R)
        out = self._batch_embed(inputs, a, shape)
        for i in range(hp.n_layer):
            out += self._batch_attention(i, a, inputs, shape)
            out += self._mlp_block(
                i, a, T, linear=lambda x, name, y, _T: self._batch_linear(x, name, y, shape))
        if R == 0:
            return out
        # The logit rows of x, gathered (an f32 "embedding" lookup of x's rows) into proj.
        out.append(k.embed(a.x, inputs.logit_rows, a.proj, R, name="logit_rows"))
        h = a.proj
        if hp.final_norm:
            out.append(self._norm(a.proj, "decoder.final_layer_norm", a.xn, R))
            h = a.xn
        if hp.n_proj != hp.n_embd:
            out.append(k.linear(h, w["decoder.project_out.weight"], a.emb, R,
                                name="decoder.project_out",
                                **self._role_products("decode")))
            h = a.emb
        if len(self.head) == 1:
            out.append(k.linear(h, self.head[0][1], a.logits, R, name="lm_head",
                                **self._role_products("decode")))
        else:
            for row0, wt in self.head:
                out += [k.linear(h, wt, a.head, R, name="lm_head",
                                 **self._role_products("decode")),
                        k.copy_block(a.head, a.logits, R, wt.shape[0], row0,
                                     name="lm_head.copy")]
        out.append(k.argmax_rows(a.logits, inputs.argmax, hp.n_vocab, R, name="argmax"))
        return out

    def _batch_attention(self, i: int, a, inputs: StepInputs,
                         shape: StepShape) -> list[Dispatch]:
        """`OPT._attention_block` for T tokens: K/V into the paged cache by slot mapping,
        paged attention at each token's position."""
        hp, k, p, T = self.hp, self.k, self._paged, shape.tokens
        blk = f"decoder.layers.{i}."
        att = blk + "self_attn."
        h = a.xn if hp.pre_norm else a.x
        out = [self._norm(a.x, blk + "self_attn_layer_norm", a.xn, T)] if hp.pre_norm else []
        out += [*self._batch_linear(h, att + "q_proj", a.q, shape),
                *self._batch_linear(h, att + "k_proj", a.k, shape),
                *self._batch_linear(h, att + "v_proj", a.v, shape),
                k.kv_write(a.k, a.v, inputs.slots, p.k[i], p.v[i], T, name=att + "kv_write"),
                k.attention_paged(a.q, p.k[i], p.v[i], a.attn, inputs.positions, inputs.seq,
                                  inputs.tables, T, hp.n_head, hp.n_head, hp.head_dim,
                                  p.block_size, self.attn_scale, name=att + "attn"),
                *self._batch_linear(a.attn, att + "out_proj", a.proj, shape),
                k.add(a.x, a.proj, T * hp.n_embd, name=blk + "attn_residual")]
        if not hp.pre_norm:
            out += self._post_norm(a, blk + "self_attn_layer_norm", T)
        return out
