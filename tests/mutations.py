"""Mutation gate: break one mechanism at a time and prove the suite notices.

    python tests/mutations.py            # every mutation (several minutes on 2 cores)
    python tests/mutations.py -k barrier # those whose name contains "barrier"

Each mutation copies the work tree to a temporary folder, replaces one exact snippet (it must
occur exactly once), regenerates the SPIR-V when a shader changed, and runs the tests that
guard the mechanism with `python -m pytest -x` in the copy (`-m` puts the copy first on
sys.path, so the mutated package is the one imported). A mutation is CAUGHT when pytest fails.
Exit status 1 if any mutation is MISSED or no longer applies. Not part of CI (it reruns the
model tests once per mutation); run it after changing a mechanism or its tests.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEN_TESTS = ["tests/test_gen_cli.py", "tests/test_gen_reflect.py", "tests/test_gen_fixtures.py",
             "tests/test_gen_variants.py", "tests/test_gen_property.py", "tests/test_gen_corpus.py"]

# (name, file, old snippet, new snippet, tests that must fail)
MUTATIONS = [
    # -- runtime: the barrier tracker (one mutation per rule) -------------------------------
    ("tracker drops RAW", "vkrt/runtime/barriers.py",
     'return "transfer" if transfer or hit[2] else "RAW"', "pass",
     ["tests/test_barriers.py", "tests/test_llama.py::test_decode_step_plan_without_recording"]),
    ("tracker drops WAW", "vkrt/runtime/barriers.py",
     'return "transfer" if transfer or hit[2] else "WAW"', "pass", ["tests/test_barriers.py"]),
    ("tracker drops WAR", "vkrt/runtime/barriers.py",
     'return "transfer" if transfer or hit[2] else "WAR"', "pass", ["tests/test_barriers.py"]),
    ("tracker: views of one buffer conflict only when they start together (unsafe)",
     "vkrt/runtime/barriers.py", "if r[0] < end and start < r[1]:", "if r[0] == start:",
     ["tests/test_barriers.py"]),
    ("tracker: whole buffers (safe, costs barriers)", "vkrt/runtime/barriers.py",
     "if r[0] < end and start < r[1]:", "if True:",
     ["tests/test_barriers.py", "tests/test_llama.py::test_decode_step_plan_without_recording"]),
    ("tracker: overlap off by one element (misses a one-element overlap)",
     "vkrt/runtime/barriers.py", "if r[0] < end and start < r[1]:",
     "if r[0] < end - 4 and start < r[1] - 4:", ["tests/test_barriers.py"]),
    ("tracker: touching views overlap (off by one the safe way)",
     "vkrt/runtime/barriers.py", "if r[0] < end and start < r[1]:",
     "if r[0] <= end and start <= r[1]:", ["tests/test_barriers.py"]),
    ("tracker clears pending accesses at submit", "vkrt/runtime/stream.py",
     "        self._new_batch = True\n        cmd = slot.cmd",
     "        self._new_batch = True\n        self.tracker.clear()\n        cmd = slot.cmd",
     ["tests/test_barriers.py", "tests/test_llama.py::test_decode_step_counters"]),
    ("copies bypass the tracker", "vkrt/runtime/dispatch.py",
     "self.reads, self.writes = [src.range], [dst.range]", "self.reads, self.writes = [], []",
     ["tests/test_barriers.py", "tests/test_runtime.py"]),
    ("barrier recorded but not emitted", "vkrt/runtime/stream.py",
     "            if barrier:\n                lib.vkCmdPipelineBarrier(",
     "            if barrier and False:\n                lib.vkCmdPipelineBarrier(",
     ["tests/test_barriers.py"]),
    ("read set from everything not written (readable ignored)", "vkrt/runtime/pipeline.py",
     "self.readable = tuple(readable[n] for n in self.binding_numbers)",
     "self.readable = tuple(True for n in self.binding_numbers)", ["tests/test_runtime.py"]),
    # -- runtime: views, push constants, descriptors, host access --------------------------
    ("descriptor binds the whole buffer, not the view", "vkrt/runtime/pipeline.py",
     '{"buffer": t.buffer.handle, "offset": t.offset, "range": t.nbytes}',
     '{"buffer": t.buffer.handle, "offset": 0, "range": t.nbytes}', ["tests/test_runtime.py"]),
    ("descriptor-set cache off", "vkrt/runtime/pipeline.py",
     "        if found is not None:\n            return found\n",
     "", ["tests/test_runtime.py", "tests/test_llama.py::test_decode_step_counters"]),
    ("push constants packed in declaration order of the call", "vkrt/runtime/op.py",
     "return self._struct.pack(*[push[n] for n in self.push_names])",
     "return self._struct.pack(*push.values())", ["tests/test_runtime.py"]),
    ("no grid limit check", "vkrt/runtime/op.py",
     "if not (0 < x <= mx and 0 < y <= my and 0 < z <= mz):",
     "if False:", ["tests/test_runtime.py"]),
    ("writable_mask ignored (everything written)", "vkrt/runtime/pipeline.py",
     "bool(meta.writable_mask >> n & 1)", "True", ["tests/test_runtime.py"]),
    # -- pipelined submission (queue.py) ---------------------------------------------------
    ("a host read that does not wait for its writer", "vkrt/runtime/queue.py",
     "            s.wait(self.value)\n", "            pass\n",
     ["tests/test_stream.py", "tests/test_kernels.py"]),
    ("a host write that does not wait for the last reader", "vkrt/runtime/stream.py",
     "            q.wait(q.last_use(rng))", "            q.wait(q.last_write(rng))",
     ["tests/test_stream.py"]),
    ("the submit waits right after submitting", "vkrt/runtime/queue.py",
     "        if self.inflight == 1:\n            self.wait(value)",
     "        if True:\n            self.wait(value)",
     ["tests/test_stream.py", "tests/test_llama.py::test_decode_step_counters"]),
    ("all slots share one staging buffer", "vkrt/runtime/queue.py",
     "        self.slots = [Slot(self.device, i) for i in range(self.inflight)]\n",
     "        self.slots = [Slot(self.device, i) for i in range(self.inflight)]\n"
     "        for other in self.slots[1:]:\n"
     "            other.staging.destroy()\n"
     "            other.staging = self.slots[0].staging\n",
     ["tests/test_stream.py"]),
    ("a slot reused without waiting for its last submission", "vkrt/runtime/queue.py",
     "        if slot.value:\n            self.wait(slot.value)",
     "        if slot.value:\n            pass",
     ["tests/test_stream.py"]),
    ("the extra decode step's token leaks into the output", "vkrt/models/generate.py",
     "            in_flight.clear()         # submitted past the stop token: never read",
     "            result.tokens += [int(r.get()[0]) for r in in_flight]",
     ["tests/test_llama.py::test_stop_token_discards_the_steps_beyond"]),
    ("token ring of one slot (step t+1's argmax overwrites token t)", "vkrt/models/generate.py",
     "            out = ring[issued % len(ring)]", "            out = ring[0]",
     ["tests/test_llama.py::test_stop_token_discards_the_steps_beyond"]),
    ("op remembers dispatches by grid and values alone (other tensors skip the checks)",
     "vkrt/runtime/op.py", "key = (tensors, grid, tuple(push.items()), name)",
     "key = (grid, tuple(push.items()), name)", ["tests/test_runtime.py"]),
    ("no binding-count check", "vkrt/runtime/op.py",
     "        if len(tensors) != len(self.dtypes):", "        if False:",
     ["tests/test_runtime.py"]),
    ("a free that is not deferred (destroyed while a command names it)", "vkrt/runtime/memory.py",
     "        if drain and self.handle is not None and dev.handle is not None:",
     "        if False:", ["tests/test_stream.py", "tests/test_runtime.py"]),
    ("readback copy in its own submission", "vkrt/runtime/stream.py",
     "            staging, offset = q.stage(t.nbytes)\n            self.record([Copy(t,",
     "            q.submit()\n"
     "            staging, offset = q.stage(t.nbytes)\n            self.record([Copy(t,",
     ["tests/test_runtime.py", "tests/test_llama.py::test_decode_step_counters_through_staging"]),
    ("device close leaks its children", "vkrt/runtime/device.py",
     "            child.close()", "            pass", ["tests/test_runtime.py"]),
    ("device choice: first discrete GPU, else device 0", "vkrt/runtime/device.py",
     "return min(infos, key=lambda d: (KIND_PREFERENCE.index(d.kind), d.index)).index",
     'return next((d.index for d in infos if d.kind == "discrete"), 0)',
     ["tests/test_device_choice.py"]),
    ("device choice: ties go to the highest index", "vkrt/runtime/device.py",
     "(KIND_PREFERENCE.index(d.kind), d.index)", "(KIND_PREFERENCE.index(d.kind), -d.index)",
     ["tests/test_device_choice.py"]),
    ("vkrt devices marks nothing", "vkrt/cli.py",
     'mark = f"  * {why}" if d.index == chosen else ""', 'mark = ""',
     ["tests/test_device_choice.py"]),
    # -- kernels ---------------------------------------------------------------------------
    ("argmax keeps the last maximum", "vkrt/glsl/argmax.comp",
     "oi < best_index[lid]", "oi > best_index[lid]", ["tests/test_kernels.py"]),
    ("argmax of all -inf returns the none index", "vkrt/glsl/argmax.comp",
     "if (v > bv || bi == 0xFFFFFFFFu)", "if (v > bv)",
     ["tests/test_kernels.py::test_argmax_of_all_minus_infinity_is_an_index"]),
    ("attention not causal", "vkrt/glsl/attention.comp",
     "uint last = pc.pos0 + t;", "uint last = pc.pos0 + gl_NumWorkGroups.y - 1;",
     ["tests/test_kernels.py"]),
    ("rope rotates the wrong way", "vkrt/glsl/rope.comp",
     "v.x * r.x - v.y * r.y, v.x * r.y + v.y * r.x", "v.x * r.x + v.y * r.y, -v.x * r.y + v.y * r.x",
     ["tests/test_kernels.py", "tests/test_llama.py::test_greedy_32_tokens_exact"]),
    ("grid: the linear workgroup ignores y", "vkrt/glsl/grid.glsl",
     "return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;",
     "return gl_WorkGroupID.x;", ["tests/test_grids.py"]),
    ("grid: tokens ignore z", "vkrt/glsl/grid.glsl",
     "return gl_WorkGroupID.y + gl_WorkGroupID.z * gl_NumWorkGroups.y;",
     "return gl_WorkGroupID.y;", ["tests/test_grids.py"]),
    ("grid: matmul rows do not spill into z", "vkrt/glsl/matmul.comp",
     "uint n = gl_WorkGroupID.x + gl_WorkGroupID.z * gl_NumWorkGroups.x;",
     "uint n = gl_WorkGroupID.x;", ["tests/test_grids.py"]),
    ("grid: matvec rows past the grid not bounded", "vkrt/glsl/matvec.comp",
     "    if (n >= pc.n_rows) return;", "", ["tests/test_grids.py", "tests/test_kernels.py"]),
    ("grid: not spread (x keeps every workgroup)", "vkrt/kernels.py",
     "    x = min(groups, limit[0])", "    x = groups", ["tests/test_grids.py"]),
    ("attention: a -inf prefix poisons the running maximum", "vkrt/glsl/attention.comp",
     "    if (mx == NEG_INF) return 0.0;\n", "",
     ["tests/test_kernels.py::test_attention_four_minus_infinity_scores_give_zeros",
      "tests/test_kernels.py::test_attention_minus_infinity_scores"]),
    ("attention: a fully masked row divides 0 by 0", "vkrt/glsl/attention.comp",
     "l > 0.0 ? acc / l : 0.0", "acc / l",
     ["tests/test_kernels.py::test_attention_four_minus_infinity_scores_give_zeros",
      "tests/test_kernels.py::test_attention_minus_infinity_scores"]),
    ("attention: +inf scores weigh exp(inf - inf)", "vkrt/glsl/attention.comp",
     "s == mx ? 1.0 : exp(s - mx)", "exp(s - mx)",
     ["tests/test_kernels.py::test_attention_scores_past_f32_range"]),
    ("attention: scale applied after the dot product", "vkrt/glsl/attention.comp",
     "s += q_s[j] * k_cache[k0 + j];",
     "s += q_s[j] / pc.scale * k_cache[k0 + j];\n            s *= pc.scale;",
     ["tests/test_kernels.py::test_attention_scores_past_f32_range"]),
    ("reduce: partials counted by gl_NumSubgroups alone", "vkrt/glsl/reduce.glsl",
     "return max(gl_NumSubgroups, (gl_WorkGroupSize.x + gl_SubgroupSize - 1) / gl_SubgroupSize);",
     "return gl_NumSubgroups;",
     ["tests/test_kernels.py::test_rmsnorm_any_workgroup"]),
    ("reduce: one subgroup per workgroup assumed", "vkrt/glsl/reduce.glsl",
     "v = subgroupAdd(v);\n    uint n = reduce_subgroups();\n    if (n == 1) return v;",
     "v = subgroupAdd(v);\n    uint n = reduce_subgroups();\n    if (n >= 1) return v;",
     ["tests/test_kernels.py::test_matvec_any_workgroup"]),
    ("argmax: tree halves only power-of-two workgroups", "vkrt/glsl/argmax.comp",
     "; width = (width + 1) / 2)", "; width = width / 2)",
     ["tests/test_kernels.py::test_argmax_any_workgroup"]),
    # -- weights as stored (weights.glsl, Kernels.weight_op, the loader) ----------------------
    ("quant: Q4_1 min term dropped", "vkrt/glsl/weights.glsl",
     "return dm.x * vec4(n) + dm.y;", "return dm.x * vec4(n);",
     ["tests/test_kernels.py::test_linear_weights_as_stored"]),
    ("quant: Q4_1 nibble order swapped", "vkrt/glsl/weights.glsl",
     "uint v = w[block + 1 + j % 4] >> (j / 4 * 4);",
     "uint v = w[block + 1 + j % 4] >> ((1 - j / 4) * 4);",
     ["tests/test_kernels.py::test_linear_weights_as_stored"]),
    ("quant: embed Q4_1 reads low nibbles only", "vkrt/glsl/weights.glsl",
     "(8 * (byte % 4) + i / 16 * 4)", "(8 * (byte % 4))",
     ["tests/test_kernels.py::test_embed_weights_as_stored"]),
    ("quant: Q8_0 scale read from the wrong half", "vkrt/glsl/weights.glsl",
     "    float d = unpackHalf2x16(half_at(block)).x;\n    int v = int(word_at(block + 2 + 4",
     "    float d = unpackHalf2x16(word_at(block)).y;\n    int v = int(word_at(block + 2 + 4",
     ["tests/test_kernels.py::test_linear_weights_as_stored"]),
    ("quant: Q8_0 quads straddling two words read from one", "vkrt/glsl/weights.glsl",
     "return byte % 4 == 0 ? w[i] : (w[i] >> 16) | (w[i + 1] << 16);", "return w[i];",
     ["tests/test_kernels.py::test_linear_weights_as_stored"]),
    ("quant: bf16 pair halves swapped", "vkrt/glsl/weights.glsl",
     "uvec2(v << 16, v & 0xFFFF0000u)", "uvec2(v & 0xFFFF0000u, v << 16)",
     ["tests/test_kernels.py::test_linear_weights_as_stored"]),
    ("quant: variant picked for the wrong dtype (q8_0 runs the q4_1 kernel)", "vkrt/kernels.py",
     '"q8_0": "q8_0",', '"q8_0": "q4_1",',
     ["tests/test_kernels.py::test_linear_weights_as_stored"]),
    ("quant: variant picked for the wrong dtype (f16 runs the bf16 kernel)", "vkrt/kernels.py",
     '"float16": "f16",', '"float16": "bf16",',
     ["tests/test_kernels.py::test_embed_weights_as_stored"]),
    ("quant: weight views not aligned", "vkrt/models/llama.py",
     "            start = _aligned(end, align)", "            start = end",
     ["tests/test_llama_variants.py::test_weights_are_views_of_one_buffer_as_stored"]),
    ("quant: unsupported weight types accepted", "vkrt/models/llama.py",
     "elif len(shape) == 2 and gtype in WEIGHT_DTYPES:",
     "elif len(shape) == 2 and gtype in (*WEIGHT_DTYPES, \"Q5_0\"):",
     ["tests/test_llama_variants.py::test_weight_type_the_kernels_do_not_read_refused_before_upload"]),
    # -- model -----------------------------------------------------------------------------
    ("grouped-query heads share KV head 0", "vkrt/glsl/attention.comp",
     "uint kvh = h / (pc.n_heads / pc.n_kv_heads);", "uint kvh = 0;",
     ["tests/test_llama.py::test_greedy_32_tokens_exact"]),
    ("KV cache written at position 0", "vkrt/models/llama.py",
     'k.copy_rows(a.v, v_cache, T, pos0,', 'k.copy_rows(a.v, v_cache, T, 0,',
     ["tests/test_llama.py::test_greedy_32_tokens_exact"]),
    # -- the Llama family as converters write it (issue 13) ----------------------------------
    ("variants: bias_add ignores the token bound", "vkrt/glsl/bias_add.comp",
     "if (i < pc.width && t < pc.n_tokens)", "if (i < pc.width)",
     ["tests/test_kernels.py::test_bias_add_rows_exact_and_bounded"]),
    ("variants: biases ignored", "vkrt/models/llama.py",
     'if name + ".bias" in w:', "if False:",
     ["tests/test_llama_variants.py::test_variant_matches_transformers[attention_bias]",
      "tests/test_llama_variants.py::test_variant_matches_transformers[mlp_bias]"]),
    ("variants: linear RoPE factor ignored", "vkrt/models/llama.py",
     "    if scale != 1.0:\n", "    if False:\n",
     ["tests/test_llama_variants.py::test_variant_matches_transformers[rope_linear]"]),
    ("variants: llama3 rope_freqs ignored", "vkrt/models/llama.py",
     "    if freq_factors is not None:\n", "    if False:\n",
     ["tests/test_llama_variants.py::test_variant_matches_transformers[rope_llama3]"]),
    ("variants: head size from embedding / heads", "vkrt/models/gguf.py",
     'head_dim = integer("llama.attention.key_length")', "head_dim = n_embd // n_head",
     ["tests/test_llama_variants.py::test_variant_matches_transformers[head_dim_32]"]),
    ("variants: unknown llama.* keys accepted", "vkrt/models/gguf.py",
     'if key.startswith("llama.") and key[6:] not in LLAMA_KEYS_IMPLEMENTED',
     'if False and key[6:] not in LLAMA_KEYS_IMPLEMENTED',
     ["tests/test_llama_variants.py::test_refused_before_upload[sliding_window]"]),
    ("variants: any RoPE scaling type accepted", "vkrt/models/gguf.py",
     "if scaling not in ROPE_SCALING_TYPES:", "if False:",
     ["tests/test_llama_variants.py::test_refused_before_upload[yarn]"]),
    ("variants: scaling type none with a factor accepted", "vkrt/models/gguf.py",
     'if scaling == "none" and rope_scale != 1.0:', "if False:",
     ["tests/test_llama_variants.py::test_refused_before_upload[scaling_none_with_factor]"]),
    ("variants: value_length unchecked", "vkrt/models/gguf.py",
     "if v_dim != head_dim:", "if False:", ["tests/test_llama_variants.py::test_refused_before_upload[value_length]"]),
    ("variants: partial RoPE accepted", "vkrt/models/gguf.py",
     "if rope_dim != head_dim:", "if False:", ["tests/test_llama_variants.py::test_refused_before_upload[partial_rope]"]),
    ("variants: unread tensors accepted", "vkrt/models/llama.py",
     "        if name not in optional:\n            raise",
     "        if name not in optional:\n            continue\n            raise",
     ["tests/test_llama_variants.py::test_refused_before_upload[qk_norm_tensor]"]),
    ("variants: optional tensor shapes unchecked", "vkrt/models/llama.py",
     "if tuple(g.tensor_info(name).shape) != optional[name]:", "if False:",
     ["tests/test_llama_variants.py::test_refused_before_upload[bias_shape]"]),
    ("variants: llama3 factors with a linear factor accepted", "vkrt/models/llama.py",
     "if ROPE_FREQS in present and hp.rope_scale != 1.0:", "if False:",
     ["tests/test_llama_variants.py::test_refused_before_upload[llama3_and_linear]"]),
    ("variants: rope_freqs values unchecked", "vkrt/models/llama.py",
     "            if bad.any():", "            if False:",
     ["tests/test_llama_variants.py::test_refused_before_upload[rope_freqs_zero]"]),
    ("variants: storage range not checked at load", "vkrt/models/llama.py",
     "            if nbytes > limit:", "            if False:",
     ["tests/test_llama_variants.py::test_weight_past_the_storage_range_refused_before_upload"]),
    # -- users' inputs (issue 11) -------------------------------------------------------------
    ("message text tokenized with special tokens", "vkrt/models/chat.py",
     'ids += tokenizer.encode("".join(run), add_bos=False, special=False)\n            ids.append',
     'ids += tokenizer.encode("".join(run), add_bos=False, special=True)\n            ids.append',
     ["tests/test_chat.py"]),
    ("chat fallback accepts forged specials", "vkrt/models/chat.py",
     "if pattern is not None and pattern.findall(real) != pattern.findall(",
     "if False and pattern.findall(real) != pattern.findall(", ["tests/test_chat.py"]),
    ("generation tag dropped", "vkrt/models/chat.py",
     "extensions=[jinja2.ext.loopcontrols, _GenerationTags]",
     "extensions=[jinja2.ext.loopcontrols]", ["tests/test_chat.py"]),
    ("second BOS added", "vkrt/models/tokenizer.py",
     "and ids[:1] != [self.bos_id]):", "):", ["tests/test_tokenizer.py"]),
    ("only EOS ends generation", "vkrt/models/tokenizer.py",
     "eog = frozenset(i for i in map(token_id, EOG_KEYS) if i is not None)",
     "eog = frozenset(i for i in map(token_id, EOG_KEYS[:1]) if i is not None)",
     ["tests/test_tokenizer.py", "tests/test_generate.py::test_eot_model_metadata"]),
    ("stream drops held bytes", "vkrt/models/tokenizer.py",
     "rest = self._tok.decode(self._ids, skip_special=self._skip)[self._emitted:]",
     'rest = ""', ["tests/test_tokenizer.py"]),
    ("embedding rows not checked against the tokenizer", "vkrt/models/gguf.py",
     "if tokens is not None and len(tokens) != n_vocab:", "if False:", ["tests/test_gguf.py"]),
    ("special-token ids not range-checked", "vkrt/models/gguf.py",
     "if i is not None and not (isinstance(i, int) and 0 <= i < n_vocab):", "if False:",
     ["tests/test_gguf.py"]),
    ("arrays of arrays refused", "vkrt/models/gguf.py",
     "        if depth >= _MAX_NESTING:", "        if depth >= 0:", ["tests/test_gguf.py"]),
    ("VKRT_* parse error escapes as ValueError", "vkrt/config.py",
     "        except ValueError as e:\n            raise ConfigError",
     "        except ZeroDivisionError as e:\n            raise ConfigError",
     ["tests/test_config.py"]),
    ("timeout inf refused", "vkrt/config.py", "    if not (value > 0):",
     "    if not (0 < value < math.inf):", ["tests/test_config.py"]),
    ("tiny temperature divides before subtracting", "vkrt/models/generate.py",
     "z = (x - x.max()) / s.temperature", "z = x / s.temperature - x.max() / s.temperature",
     ["tests/test_generate.py::test_tiny_temperature_is_greedy"]),
    ("non-finite temperature accepted", "vkrt/models/generate.py",
     "math.isfinite(t) and t >= 0", "t >= 0",
     ["tests/test_generate.py::test_bad_sampling_refused"]),
    ("prefill chunks ignore their position", "vkrt/models/generate.py",
     "        model.forward(a.ids, batch_size, pos)\n", "        model.forward(a.ids, batch_size, 0)\n",
     ["tests/test_generate.py::test_chunked_prefill_is_token_exact"]),
    ("broken pipe ends with a traceback", "vkrt/cli.py",
     "    except BrokenPipeError:\n        _die_like_sigpipe()",
     "    except ZeroDivisionError:\n        _die_like_sigpipe()",
     ["tests/test_cli.py::test_prompt_from_stdin_into_a_closed_pipe"]),
    ("Ctrl-C waits for the GPU", "vkrt/cli.py",
     "        return _in_worker(lambda: args.run(args))", "        return args.run(args)",
     ["tests/test_cli.py::test_ctrl_c_during_prefill"]),
    ("unencodable output raises", "vkrt/cli.py",
     '(sys.stdout, "replace"), ', "",
     ["tests/test_cli.py::test_output_the_terminal_cannot_encode"]),
    # -- gen-spirv -------------------------------------------------------------------------
    ("reflection ignores member NonWritable", "vkrt/gen/reflect.py",
     "non_writable = non_writable or _all_members(m, elem, D_NON_WRITABLE)",
     "non_writable = non_writable", GEN_TESTS),
    ("aliased binding: last alias wins", "vkrt/gen/reflect.py",
     'old["writable"] |= d["writable"]', 'old["writable"] = d["writable"]', GEN_TESTS),
    ("no WorkgroupSize override", "vkrt/gen/reflect.py",
     "if builtin and builtin[0] == BUILTIN_WORKGROUP_SIZE:", "if False:", GEN_TESTS),
    ("--check ignores SPIR-V bytes", "vkrt/gen/build.py",
     "!= tree.spirv[name]:", "!= tree.spirv[name] and False:", GEN_TESTS),
    ("loader skips the sha256 check", "vkrt/gen/metadata.py",
     "if digest != meta.sha256:", "if False:", GEN_TESTS),
    ("compiler version not pinned", "vkrt/gen/compile.py",
     "if version == PINNED_VERSION:", "if version:", GEN_TESTS),
    ("literal strings read in the file's byte order", "vkrt/gen/reflect.py",
     'raw = struct.pack(f"<{len(words)}I", *words)',
     'raw = struct.pack(f"{self.endian}{len(words)}I", *words)', GEN_TESTS),
    ("spec idiom: second default dropped", "vkrt/gen/reflect.py",
     'old["defaults"] = [*defaults, entry["default"]]', "pass", GEN_TESTS),
    ("spec idiom: workgroup default from the named constant", "vkrt/gen/reflect.py",
     "    return (int(m.scalar_value(const_id, where)),",
     "    named = [c for c in m.constants if m.names.get(c) and m.spec_id(c) is not None\n"
     "             and m.spec_id(c) == m.spec_id(const_id)]\n"
     "    return (int(m.scalar_value(named[0] if named else const_id, where)),", GEN_TESTS),
    ("spec idiom: get_pipeline accepts it unspecialized", "vkrt/runtime/pipeline.py",
     "if sc.defaults and sc.id not in self.spec:", "if False:", GEN_TESTS),
    ("spec idiom: loader drops defaults", "vkrt/gen/metadata.py",
     'tuple(s.get("defaults", ()))', "()", GEN_TESTS),
    ("push pointer: 4 bytes", "vkrt/gen/reflect.py",
     "        return POINTER_BYTES", "        return 4", GEN_TESTS),
    ("push pointer: any storage class accepted", "vkrt/gen/reflect.py",
     "if a[0] != SC_PHYSICAL_STORAGE_BUFFER:", "if False:", GEN_TESTS),
    ("refusal: array of arrays not named", "vkrt/gen/reflect.py",
     "    if op in (OP_TYPE_ARRAY, OP_TYPE_RUNTIME_ARRAY):\n        # Vulkan binds",
     "    if False:\n        # Vulkan binds", GEN_TESTS),
    ("refusal: kinds by opcode", "vkrt/gen/reflect.py",
     "        return _TYPE_WORDS[op]", '        return f"type opcode {op}"', GEN_TESTS),
]


def run(name: str, file: str, old: str, new: str, tests: list[str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="vkrt-mut-") as tmp:
        work = Path(tmp) / "work"
        shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(
            ".git", "__pycache__", ".venv", ".cache", ".gl", ".whl", ".m1", ".m2"))
        path = work / file
        text = path.read_text()
        if text.count(old) != 1:
            print(f"STALE   {name}: snippet found {text.count(old)} times in {file}")
            return False
        path.write_text(text.replace(old, new))
        env = dict(os.environ, XDG_CACHE_HOME=str(Path(tmp) / "cache"))
        if file.startswith("vkrt/glsl/"):
            gen = subprocess.run([sys.executable, "-m", "vkrt.gen.cli"], cwd=work, env=env,
                                 capture_output=True, text=True)
            if gen.returncode:
                print(f"STALE   {name}: the mutated shader does not compile: {gen.stderr[-200:]}")
                return False
        r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                            *tests], cwd=work, env=env, capture_output=True, text=True)
        tail = (r.stdout.strip().splitlines() or [r.stderr[-200:]])[-1]
        caught = r.returncode != 0
        print(f"{'CAUGHT' if caught else 'MISSED'}  {name}: {tail}", flush=True)
        return caught


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="run the mutations whose name contains this")
    args = ap.parse_args()
    results = [run(*m) for m in MUTATIONS if args.k in m[0]]
    print(f"{sum(results)}/{len(results)} mutations caught")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
