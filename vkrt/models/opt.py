"""OPT (Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models") on vkrt:
weights from a Hugging Face checkpoint folder, the forward as a list of dispatches.

Read `OPT.step` top to bottom: it follows transformers' models/opt/modeling_opt.py
(`OPTDecoder.forward`, `OPTDecoderLayer.forward`, `OPTAttention.forward`):
- x = project_in(embed_tokens[ids]) + embed_positions[position + 2] (project_in only when
  `word_embed_proj_dim` != `hidden_size`; the learned positions are offset by 2,
  `OPTLearnedPositionalEmbedding.offset`: positions = cumsum(attention mask) - 1, so an
  unpadded prompt's token at position p reads row p + 2);
- per layer, pre-LayerNorm (`do_layer_norm_before`, every OPT but opt-350m):
  x += out_proj(attention(LN1(x))); x += fc2(relu(fc1(LN2(x)))); post-LayerNorm (opt-350m):
  x = LN1(x + out_proj(attention(x))); x = LN2(x + fc2(relu(fc1(x))));
- attention: multi-head, causal, q = q_proj(h) * head_dim^-0.5 (the scale multiplies q after
  its bias, as transformers does; here inside the attention kernel, which scales q before the
  dot products, the same f32 products), softmax(q k^T) v over the KV cache;
- final_layer_norm (pre-LN models without `_remove_final_layer_norm`), project_out, then the
  logits x @ embed_tokens^T (lm_head tied to embed_tokens, `tie_word_embeddings`).
Every linear has a bias (`enable_bias`), except project_in/out and lm_head. LayerNorm is
torch.nn.LayerNorm's, eps 1e-5 (OPTConfig has no eps key). Dispatches are named after
transformers' parameters without the `model.` prefix (`decoder.layers.3.self_attn.q_proj`).

Weights (f32, f16 or bf16 in the files) are converted to f32 one tensor at a time on the
host and uploaded. A table larger than one binding (maxStorageBufferRange: embed_tokens of
opt-125m is 154 MB as f32, lavapipe binds 128 MiB) is uploaded in slices of rows: the lookup
runs once per slice (`embed_range`) and the logits are computed slice by slice.
Shapes: activations `[tokens, width]` f32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vkrt.errors import ModelFormatError
from vkrt.kernels import Kernels, attention_partials
from vkrt.models.decoder import Decoder
from vkrt.models.hf_folder import DTYPES, HFFolder
from vkrt.models.opt_batch import OPTBatch
from vkrt.models.scratch import KVBuffers, arena, grow, kv_cache
from vkrt.runtime.device import Device
from vkrt.runtime.dispatch import Dispatch
from vkrt.runtime.memory import Buffer
from vkrt.runtime.pipeline import PipelineCache
from vkrt.runtime.stream import Stream
from vkrt.runtime.tensor import Tensor

POSITION_OFFSET = 2   # OPTLearnedPositionalEmbedding.offset
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which OPTDecoder uses
SLICE_ROWS = 64        # table slices start at multiples of this row (aligned logits views)
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim",
            "max_position_embeddings")


@dataclass(frozen=True)
class OPTHParams:
    """Hyperparameters from config.json (OPTConfig's names and defaults).

    n_embd: hidden_size; n_proj: word_embed_proj_dim (embedding width; = n_embd when absent);
    n_ctx: max_position_embeddings; pre_norm: do_layer_norm_before; final_norm: the decoder's
    final_layer_norm exists (pre_norm and not _remove_final_layer_norm); bias: enable_bias;
    tied: tie_word_embeddings (lm_head is embed_tokens)."""
    n_layer: int
    n_embd: int
    n_head: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx: int
    n_proj: int
    pre_norm: bool
    final_norm: bool
    bias: bool
    tied: bool
    bos_id: int | None
    eos_id: int | None
    norm_eps: float = LAYER_NORM_EPS

    @classmethod
    def from_config(cls, config: dict, path: str) -> "OPTHParams":
        """Raises ModelFormatError (one line naming the file and key) for another model_type,
        an activation other than relu, LayerNorm without affine parameters, a missing or
        non-integer required key, hidden_size not a multiple of num_attention_heads, or
        widths the kernels cannot take (not multiples of 4)."""
        where = f"{path}/config.json"
        if config.get("model_type") != "opt":
            raise ModelFormatError(f"{where}: model_type {config.get('model_type')!r} is not "
                                   "supported here (supported: 'opt')")
        act = config.get("activation_function", "relu")
        if act != "relu":
            raise ModelFormatError(f"{where}: activation_function {act!r} is not supported "
                                   "(supported: 'relu')")
        if not config.get("layer_norm_elementwise_affine", True):
            raise ModelFormatError(f"{where}: layer_norm_elementwise_affine false is not "
                                   "supported (LayerNorm with weight and bias only)")
        for key in REQUIRED:
            if key not in config:
                raise ModelFormatError(f"{where}: missing key {key!r}")
            v = config[key]
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ModelFormatError(f"{where}: key {key!r} is {v!r}, expected a positive "
                                       "integer")
        n_embd, n_head = config["hidden_size"], config["num_attention_heads"]
        n_proj = config.get("word_embed_proj_dim") or n_embd
        if n_embd % n_head or (n_embd // n_head) % 4:
            raise ModelFormatError(f"{where}: hidden_size {n_embd} is not a multiple of "
                                   f"num_attention_heads {n_head} with heads of a multiple "
                                   "of 4 (vec4 loads)")
        for key, v in (("hidden_size", n_embd), ("ffn_dim", config["ffn_dim"]),
                       ("word_embed_proj_dim", n_proj)):
            if not isinstance(v, int) or v % 4:
                raise ModelFormatError(f"{where}: {key} {v!r} must be a multiple of 4")
        pre = bool(config.get("do_layer_norm_before", True))

        def token(key):
            v = config.get(key)
            return v[0] if isinstance(v, list) and v else v if isinstance(v, int) else None

        return cls(n_layer=config["num_hidden_layers"], n_embd=n_embd, n_head=n_head,
                   head_dim=n_embd // n_head, n_ff=config["ffn_dim"],
                   n_vocab=config["vocab_size"], n_ctx=config["max_position_embeddings"],
                   n_proj=n_proj, pre_norm=pre,
                   final_norm=pre and not config.get("_remove_final_layer_norm", False),
                   bias=bool(config.get("enable_bias", True)),
                   tied=bool(config.get("tie_word_embeddings", True)),
                   bos_id=token("bos_token_id"), eos_id=token("eos_token_id"))


def expected_tensors(hp: OPTHParams) -> dict[str, tuple[int, ...]]:
    """The tensors the forward reads (names without the `model.` prefix) and their shapes."""
    H, P, F = hp.n_embd, hp.n_proj, hp.n_ff
    shapes = {"decoder.embed_tokens.weight": (hp.n_vocab, P),
              "decoder.embed_positions.weight": (hp.n_ctx + POSITION_OFFSET, H)}
    if P != H:
        shapes["decoder.project_in.weight"] = (H, P)
        shapes["decoder.project_out.weight"] = (P, H)
    if hp.final_norm:
        shapes["decoder.final_layer_norm.weight"] = shapes["decoder.final_layer_norm.bias"] = (H,)
    if not hp.tied:
        shapes["lm_head.weight"] = (hp.n_vocab, P)
    for i in range(hp.n_layer):
        b = f"decoder.layers.{i}."
        linears = {"self_attn.q_proj": (H, H), "self_attn.k_proj": (H, H),
                   "self_attn.v_proj": (H, H), "self_attn.out_proj": (H, H),
                   "fc1": (F, H), "fc2": (H, F)}
        for name, shape in linears.items():
            shapes[b + name + ".weight"] = shape
            if hp.bias:
                shapes[b + name + ".bias"] = (shape[0],)
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            shapes[b + norm + ".weight"] = shapes[b + norm + ".bias"] = (H,)
    return shapes


@dataclass
class Activations:
    """Scratch tensors for a forward over up to `n_tokens` tokens with `logit_rows` rows of
    logits, disjoint views of one buffer (`arena`); `tokens` is the token ring of
    `vkrt.models.llama.Activations` (one [1] u32 slot per in-flight step), `token` its first.
    `head` ([logit_rows, slice rows]) holds one slice's logits when the output table is in
    several slices and several rows are kept (copied into `logits` by `copy_block`)."""
    n_tokens: int
    logit_rows: int
    arena: Buffer
    ids: Tensor      # [tokens] u32
    x: Tensor        # [tokens, n_embd] residual stream
    xn: Tensor       # [tokens, n_embd] normed
    q: Tensor        # [tokens, n_embd]
    k: Tensor
    v: Tensor
    attn: Tensor
    attn_part: Tensor  # decode attention's partial states (kernels.attention_partials)
    proj: Tensor     # [tokens, n_embd] attention or MLP output before the residual add
    ff: Tensor       # [tokens, n_ff]
    emb: Tensor      # [tokens, n_proj] token embeddings before project_in / after project_out
    logits: Tensor   # [logit_rows, n_vocab]
    head: Tensor | None
    tokens: list
    token: Tensor

    @classmethod
    def allocate(cls, device: Device, hp: OPTHParams, n_tokens: int, logit_rows: int,
                 ring: int, slice_rows: int) -> "Activations":
        T, H = n_tokens, hp.n_embd
        layout = {"ids": ("uint32", (T,)), **{n: ("float32", (T, H)) for n in (
            "x", "xn", "q", "k", "v", "attn", "proj")},
            "ff": ("float32", (T, hp.n_ff)), "emb": ("float32", (T, hp.n_proj)),
            "logits": ("float32", (logit_rows, hp.n_vocab)),
            "attn_part": ("float32", (attention_partials(hp.n_head, hp.head_dim),))}
        if slice_rows < hp.n_vocab and logit_rows > 1:
            layout["head"] = ("float32", (logit_rows, slice_rows))
        layout.update({f"token{j}": ("uint32", (1,)) for j in range(max(1, ring))})
        buffer, views = arena(device, layout)
        tokens = [views.pop(f"token{j}") for j in range(max(1, ring))]
        views.setdefault("head", None)
        return cls(T, logit_rows, buffer, tokens=tokens, token=tokens[0], **views)

    def close(self) -> None:
        self.arena.close()


class OPT(OPTBatch, Decoder):
    """An OPT model resident on one device; `OPT.from_folder(device, path)` builds it.

    Interface of `Llama` (what `vkrt.models.generate.generate` uses): `hp` (`n_ctx`,
    `n_vocab`, ...), `stream`, `max_seq`, `setup_caches(max_seq)`, `activations(n_tokens,
    logit_rows)`, `step(...)`, `forward(...)`, `logits(token_ids)`, `close()`.
    `embed` is embed_tokens as [(first row, f32 tensor of the slice)]; the output projection
    reads the same slices (tied) or lm_head's. Several sequences at once over a paged KV
    cache: `setup_paged_cache`, `execute_batch` (`OPTBatch`, vkrt/models/opt_batch.py, over
    vkrt/models/batch.py's `PagedBatch`).
    """

    def __init__(self, device: Device, hp: OPTHParams, weights: dict[str, Tensor],
                 embed: list[tuple[int, Tensor]], head: list[tuple[int, Tensor]],
                 stream: Stream, pipelines: PipelineCache):
        self.device, self.hp, self.w, self.embed, self.head = device, hp, weights, embed, head
        self.stream, self.pipelines = stream, pipelines
        self.acts: Activations | None = None
        self.kv: KVBuffers | None = None
        self.k_cache: list[Tensor] = []
        self.v_cache: list[Tensor] = []
        self.max_seq = 0
        self.k = Kernels(pipelines, head_dim=hp.head_dim)
        self.attn_scale = float(np.float32(hp.head_dim ** -0.5))  # OPTAttention.scaling

    @classmethod
    def from_folder(cls, device: Device, path: str, progress: bool = False,
                    max_binding_bytes: int | None = None) -> "OPT":
        """Read config.json and the safetensors weights of the checkpoint folder `path`,
        check every tensor (names with or without the `model.` prefix; `lm_head.weight` is
        ignored when tied), then convert each to f32 and upload it.

        max_binding_bytes: the largest f32 tensor bound whole (default: the device's
        maxStorageBufferRange); embed_tokens and lm_head larger than it are uploaded in
        slices of rows, any other tensor larger is refused. Tests lower it to run slices.
        Raises: ModelFormatError (config, a missing, misshapen, unknown or wrongly typed
        tensor, a truncated or corrupt file: one line naming the file and key or tensor),
        DeviceMemoryError when the weights do not fit.
        """
        from tqdm import tqdm

        folder = HFFolder(path)
        try:
            hp = OPTHParams.from_config(folder.config, folder.path)
            names = _check_tensors(folder, hp)
            limit = max_binding_bytes or device.max_storage_buffer_range
            tables = {"decoder.embed_tokens.weight"} | ({"lm_head.weight"} if not hp.tied else set())
            for name, stored in names.items():
                nbytes = int(np.prod(folder.shape(stored))) * 4
                if name not in tables and nbytes > limit:
                    raise ModelFormatError(
                        f"{folder.tensors[stored][0]}: tensor {stored!r} is {nbytes} bytes as "
                        f"f32, more than the device's maxStorageBufferRange of {limit} bytes")
            rows = max(SLICE_ROWS, limit // (hp.n_proj * 4) // SLICE_ROWS * SLICE_ROWS)
            stream = Stream(device)
            weights, sliced = {}, {}
            for name, stored in tqdm(names.items(), desc="loading weights", unit="tensor",
                                     disable=not progress, leave=False):
                array = folder.tensor_f32(stored)
                if name in tables:
                    sliced[name] = [(r, stream.upload(np.ascontiguousarray(array[r:r + rows]),
                                                      name=f"{name}[{r}:]"))
                                    for r in range(0, len(array), rows)]
                else:
                    weights[name] = stream.upload(array, name=name)
                del array
        finally:
            folder.close()
        embed = sliced["decoder.embed_tokens.weight"]
        head = embed if hp.tied else sliced["lm_head.weight"]
        return cls(device, hp, weights, embed, head, stream, PipelineCache(device))

    # -- buffers ---------------------------------------------------------------------------
    def setup_caches(self, max_seq: int) -> None:
        """Allocate the KV cache for sequences of up to `max_seq` tokens: per layer,
        `k_cache[i]`, `v_cache[i]` of `[max_seq, n_embd]` `kv_dtype` (f32 or f16)."""
        if max_seq > self.hp.n_ctx:
            raise ValueError(f"{max_seq} positions exceed max_position_embeddings "
                             f"{self.hp.n_ctx}")
        self._close_caches()
        self.kv, self.k_cache, self.v_cache = kv_cache(
            self.device, self.hp.n_layer, max_seq, self.hp.n_embd,
            lambda i, what: f"decoder.layers.{i}.self_attn.{what}", self.kv_dtype)
        self.max_seq = max_seq

    def _close_caches(self) -> None:
        if self.kv is not None:
            self.kv.close()
            self.kv = None

    def activations(self, n_tokens: int, logit_rows: int = 1) -> Activations:
        """Scratch for a forward of `n_tokens` tokens keeping `logit_rows` rows of logits,
        reallocated (larger) only when the current one is too small."""
        slice_rows = self.head[0][1].shape[0]
        self.acts = grow(self.acts, n_tokens, logit_rows, self.stream.inflight,
                         lambda n, rows, ring: Activations.allocate(
                             self.device, self.hp, n, rows, ring, slice_rows))
        return self.acts

    # -- the forward -----------------------------------------------------------------------
    def _linear(self, x: Tensor, name: str, y: Tensor, T: int) -> list[Dispatch]:
        """y = x W^T + b for T tokens: transformers' nn.Linear `name` (bias when present)."""
        out = [self.k.linear(x, self.w[name + ".weight"], y, T, name=name)]
        if name + ".bias" in self.w:
            out.append(self.k.bias_add(y, self.w[name + ".bias"], T, name=name + ".bias"))
        return out

    def _norm(self, x: Tensor, name: str, out: Tensor, T: int) -> Dispatch:
        w = self.w
        return self.k.layernorm(x, w[name + ".weight"], w[name + ".bias"], out, T,
                                self.hp.norm_eps, name)

    def _attention_block(self, i: int, a: Activations, T: int, pos0: int) -> list[Dispatch]:
        hp, k, blk = self.hp, self.k, f"decoder.layers.{i}."
        att = blk + "self_attn."
        h = a.xn if hp.pre_norm else a.x
        out = [self._norm(a.x, blk + "self_attn_layer_norm", a.xn, T)] if hp.pre_norm else []
        out += [*self._linear(h, att + "q_proj", a.q, T),
                *self._linear(h, att + "k_proj", a.k, T),
                *self._linear(h, att + "v_proj", a.v, T),
                k.copy_rows(a.k, self.k_cache[i], T, pos0, name=att + "k_cache"),
                k.copy_rows(a.v, self.v_cache[i], T, pos0, name=att + "v_cache"),
                *k.attention(a.q, self.k_cache[i], self.v_cache[i], a.attn, T, hp.n_head,
                             hp.n_head, hp.head_dim, pos0, self.attn_scale, a.attn_part,
                             name=att + "attn"),
                *self._linear(a.attn, att + "out_proj", a.proj, T),
                k.add(a.x, a.proj, T * hp.n_embd, name=blk + "attn_residual")]
        if not hp.pre_norm:
            out += self._post_norm(a, blk + "self_attn_layer_norm", T)
        return out

    def _mlp_block(self, i: int, a: Activations, T: int, linear=None) -> list[Dispatch]:
        """Layer i's MLP for T tokens: (pre-)LayerNorm, fc1 + bias, ReLU, fc2 + bias, the
        residual add, post-LayerNorm when the model is post-LN. `linear`: the product
        (`_linear` by default; the batched step passes its matrix-product one)."""
        hp, k, blk = self.hp, self.k, f"decoder.layers.{i}."
        linear = linear or self._linear
        h = a.xn if hp.pre_norm else a.x
        out = [self._norm(a.x, blk + "final_layer_norm", a.xn, T)] if hp.pre_norm else []
        out += [*linear(h, blk + "fc1", a.ff, T),
                k.relu(a.ff, T * hp.n_ff, name=blk + "relu"),
                *linear(a.ff, blk + "fc2", a.proj, T),
                k.add(a.x, a.proj, T * hp.n_embd, name=blk + "mlp_residual")]
        if not hp.pre_norm:
            out += self._post_norm(a, blk + "final_layer_norm", T)
        return out

    def _post_norm(self, a: Activations, name: str, T: int) -> list[Dispatch]:
        """x = LayerNorm(x) (post-LN, do_layer_norm_before false): normed into xn, copied back."""
        return [self._norm(a.x, name, a.xn, T),
                self.k.copy_rows(a.xn, a.x, T, 0, name=name + ".copy")]

    def _embed(self, ids: Tensor, a: Activations, T: int, pos0: int) -> list[Dispatch]:
        hp, k = self.hp, self.k
        dst = a.emb if hp.n_proj != hp.n_embd else a.x
        if len(self.embed) == 1:
            out = [k.embed(self.embed[0][1], ids, dst, T, name="decoder.embed_tokens")]
        else:
            out = [k.embed_range(table, row0, ids, dst, T, name="decoder.embed_tokens")
                   for row0, table in self.embed]
        if hp.n_proj != hp.n_embd:
            out.append(k.linear(a.emb, self.w["decoder.project_in.weight"], a.x, T,
                                name="decoder.project_in"))
        out.append(k.add_rows(a.x, self.w["decoder.embed_positions.weight"], T,
                              pos0 + POSITION_OFFSET, name="decoder.embed_positions"))
        return out

    def _output(self, h: Tensor, a: Activations, rows: int, x_row: int) -> list[Dispatch]:
        """Logits of `rows` rows of `h` [tokens, n_proj] from row `x_row` (x_row must be 0
        when rows > 1), over the output table's slices."""
        k = self.k
        if len(self.head) == 1:
            return [k.linear(h, self.head[0][1], a.logits, rows, x_row=x_row, name="lm_head")]
        out = []
        for row0, w in self.head:
            n = w.shape[0]
            if rows > 1:
                out += [k.linear(h, w, a.head, rows, name="lm_head"),
                        k.copy_block(a.head, a.logits, rows, n, row0, name="lm_head.copy")]
            else:   # row 0 of logits, columns row0 .. row0 + n: an aligned view
                cols = Tensor(a.logits.buffer, a.logits.offset + row0 * 4, n * 4, "float32",
                              (n,), f"logits[{row0}:]")
                out.append(k.linear(h, w, cols, 1, x_row=x_row, name="lm_head"))
        return out

    def step(self, ids: Tensor, n_tokens: int, pos0: int,
             all_logits: bool = False, token_out: Tensor | None = None) -> list[Dispatch]:
        """The dispatches of one forward over `n_tokens` token ids (u32 in `ids`) at positions
        pos0 .. pos0 + n_tokens - 1, writing K/V into the cache. Nothing is recorded.
        Afterwards `acts.logits` holds `[n_tokens, n_vocab]` logits when `all_logits`, else
        the last token's, and `token_out` (default `acts.token`) its argmax.
        Raises: ValueError when the positions exceed the KV cache."""
        hp, T = self.hp, n_tokens
        if pos0 + T > self.max_seq:
            raise ValueError(f"positions {pos0}..{pos0 + T - 1} exceed the KV cache of "
                             f"{self.max_seq} tokens (setup_caches)")
        a = self.activations(T, T if all_logits else 1)
        out = self._embed(ids, a, T, pos0)
        for i in range(hp.n_layer):
            out += self._attention_block(i, a, T, pos0)
            out += self._mlp_block(i, a, T)
        h = a.x
        if hp.final_norm:
            out.append(self._norm(a.x, "decoder.final_layer_norm", a.xn, T))
            h = a.xn
        rows, x_row = (T, 0) if all_logits else (1, T - 1)   # the rows the logits need
        if hp.n_proj != hp.n_embd:
            out.append(self.k.linear(h, self.w["decoder.project_out.weight"], a.emb, rows,
                                     x_row=x_row, name="decoder.project_out"))
            h, x_row = a.emb, 0
        out += self._output(h, a, rows, x_row)
        last_row = (T - 1) * hp.n_vocab if all_logits else 0
        out.append(self.k.argmax(a.logits, a.token if token_out is None else token_out,
                                 hp.n_vocab, last_row, name="argmax"))
        return out

    def row_tables(self) -> list[Tensor]:
        """The learned positions, and embed_tokens' slices unless lm_head is them (tied)."""
        embed = [] if self.head is self.embed else [t for _, t in self.embed]
        return [self.w["decoder.embed_positions.weight"], *embed]

    def weight_tensors(self) -> list[Tensor]:
        """The weights of `w` and every slice of embed_tokens (and of lm_head if untied)."""
        slices = self.embed + ([] if self.head is self.embed else self.head)
        return list(self.w.values()) + [t for _, t in slices]

    def close(self) -> None:
        """Free every buffer and the stream (pipelines are freed with the device)."""
        if self.acts is not None:
            self.acts.close()
        for t in self.weight_tensors():
            t.buffer.close()
        self._close_caches()
        self._close_paged()
        self.stream.close()


def checkpoint_from_folder(path: str, config: dict):
    """The registry's entry (vkrt.models.registry): an OPT checkpoint folder's
    hyperparameters, tokenizer and chat template (tokenizer_config.json's `chat_template`,
    when there is one), checked; `build(device, progress)` reads and uploads the weights."""
    import os

    from vkrt.models.hf_folder import load_tokenizer, read_json
    from vkrt.models.registry import Checkpoint

    hp = OPTHParams.from_config(config, path)
    tokenizer = load_tokenizer(path)
    tok_config = os.path.join(path, "tokenizer_config.json")
    template = read_json(tok_config).get("chat_template") if os.path.exists(tok_config) else None
    return Checkpoint(str(path), "opt", hp, tokenizer, template if isinstance(template, str)
                      else None, lambda device, progress=False: OPT.from_folder(device, path,
                                                                                progress))


def _check_tensors(folder: HFFolder, hp: OPTHParams) -> dict[str, str]:
    """{name the forward reads: name stored in the files}, every one present with its shape
    and a supported dtype, and nothing else in the files (the `model.` prefix is accepted;
    lm_head.weight is accepted and ignored when tied). Raises ModelFormatError naming the
    file (or folder) and the first missing, misshapen, wrongly typed or unknown tensor."""
    stored = folder.tensors
    prefix = "model." if "model.decoder.embed_tokens.weight" in stored else ""
    shapes = expected_tensors(hp)
    names = {}
    for name, shape in shapes.items():
        key = name if name == "lm_head.weight" else prefix + name
        if key not in stored:
            raise ModelFormatError(f"{folder.path}: missing tensor {key!r}")
        file, dtype, got = stored[key][:3]
        if got != shape:
            raise ModelFormatError(f"{file}: tensor {key!r} has shape {got}, expected {shape}")
        if dtype not in DTYPES:
            raise ModelFormatError(f"{file}: tensor {key!r} is {dtype}; supported: "
                                   f"{', '.join(DTYPES)}")
        names[name] = key
    for key in stored:
        if key in names.values() or (key == "lm_head.weight" and hp.tied):
            continue
        raise ModelFormatError(f"{stored[key][0]}: tensor {key!r} {list(stored[key][2])} is not "
                               "read by vkrt's OPT forward (refused, not ignored)")
    return names
