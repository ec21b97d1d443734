"""The token loop on the default model (one load, the session's `llama` fixture): chunked
prefill, stop ids, sampling edge cases; the end-of-turn rule through the command line."""
import subprocess
import sys

import numpy as np
import pytest

from vkrt.errors import ConfigError, VkrtError
from vkrt.models.chat import encode_chat, render_chat
from vkrt.models.generate import Sampling, _sample, generate, logprobs_of, penalized
from vkrt.models.gguf import load_gguf
from vkrt.models.tokenizer import Tokenizer, load_tokenizer

PROMPT = "1, 2, 3, 4, 5,"   # 14 tokens; greedy " 6, 7, 8" is robust (test_llama checks 32)


@pytest.fixture(scope="module")
def tok(default_gguf):
    return load_tokenizer(default_gguf)


@pytest.fixture(scope="module")
def unchunked(llama, tok):
    """Greedy tokens with the whole prompt in one forward (test_llama's reference path)."""
    ids = tok.encode(PROMPT)
    return generate(llama, ids, 6, batch_size=len(ids)).tokens


@pytest.mark.parametrize("batch_size", [1, 5])
def test_chunked_prefill_is_token_exact(llama, tok, unchunked, batch_size):
    ids = tok.encode(PROMPT)
    # Overwrite the KV cache first: stale entries of the same prompt would hide a chunk
    # written at the wrong positions.
    generate(llama, tok.encode("x y z w " * 4), 1)
    done = []
    got = generate(llama, ids, 6, batch_size=batch_size, on_prefill=done.append)
    assert got.tokens == unchunked
    assert tok.decode(unchunked).startswith(" 6, 7")
    # one call per chunk, the last after the first token is out
    assert sum(done) == len(ids) and len(done) == -(-len(ids) // batch_size)


def test_stops_at_any_stop_id(llama, tok, unchunked):
    # Stop ids taken from the unstopped run: it ends right after the first one produced.
    first = unchunked.index(unchunked[2]) + 1
    got = generate(llama, tok.encode(PROMPT), 6, stop_ids={unchunked[2], 999_999})
    assert got.tokens == unchunked[:first] and got.stopped_at_eos and first < len(unchunked)


def test_logits_of_empty_prompt(llama):
    with pytest.raises(VkrtError, match="the prompt is empty"):
        llama.logits([])
    with pytest.raises(VkrtError, match="the prompt is empty"):
        generate(llama, [], 4)


def test_batch_size_checked(llama):
    with pytest.raises(ConfigError, match="batch size must be an integer >= 1, got 0"):
        generate(llama, [1, 2], 1, batch_size=0)


# --- sampling (host side, no model) ----------------------------------------------------------

@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-30])
def test_tiny_temperature_is_greedy(temperature):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=49152).astype(np.float32) * 10
    s = Sampling(temperature, 0.9, 0)
    gen = np.random.Generator(np.random.PCG64(0))
    assert {_sample(logits, s, gen) for _ in range(20)} == {int(logits.argmax())}


@pytest.mark.parametrize("temperature", [1.0, 1e-30])
def test_sampling_infinite_and_nan_logits(temperature):
    """-inf logits are never drawn and +inf ones share all the mass, at any temperature
    (no inf - inf = NaN); every logit -inf, or a NaN, is one clear error, never a NaN
    distribution handed to the generator."""
    gen = np.random.Generator(np.random.PCG64(2))
    s = Sampling(temperature, 1.0, 2)
    x = np.array([-np.inf, 1.0, -np.inf, 2.0], np.float32)
    assert {_sample(x, s, gen) for _ in range(200)} <= {1, 3}
    x = np.array([np.inf, 5.0, np.inf, -np.inf], np.float32)
    assert {_sample(x, s, gen) for _ in range(200)} == {0, 2}
    with pytest.raises(VkrtError, match="^every one of the 4 logits is -inf"):
        _sample(np.full(4, -np.inf, np.float32), s, gen)
    with pytest.raises(VkrtError, match=r"^the logits hold NaN \(at id 1\)"):
        _sample(np.array([0.0, np.nan, 1.0], np.float32), s, gen)


def test_logprobs_are_log_softmax_with_the_most_likely_first():
    """`logprobs_of`: log(softmax(x)) of the chosen id in float64 (against the formula in
    float64 with math.fsum), its top k sorted by probability, equal ones by id; k = 0 and
    k past the vocabulary; +inf logits share the mass, -inf ones get -inf; NaN and an
    all -inf row raise one clear error."""
    import math

    rng = np.random.default_rng(3)
    x = (rng.normal(size=1000) * 8).astype(np.float32)
    x[[10, 20]] = x.max() + 1                           # a tie for the most likely
    lse = float(x.max()) + math.log(math.fsum(math.exp(float(v) - float(x.max())) for v in x))
    lp, top = logprobs_of(x, 7, 5)
    assert abs(lp - (float(x[7]) - lse)) < 1e-12
    assert [i for i, _ in top[:2]] == [10, 20]
    want = sorted(range(1000), key=lambda i: (-float(x[i]), i))[:5]
    assert [i for i, _ in top] == want
    assert all(abs(v - (float(x[i]) - lse)) < 1e-12 for i, v in top)
    assert logprobs_of(x, 7, 0)[1] == [] and len(logprobs_of(x[:3], 0, 20)[1]) == 3
    lp, top = logprobs_of(np.array([np.inf, 1.0, np.inf, -np.inf], np.float32), 0, 4)
    assert lp == math.log(0.5) and top[:2] == [(0, math.log(0.5)), (2, math.log(0.5))]
    assert top[2][1] == -np.inf
    with pytest.raises(VkrtError, match="^every one of the 2 logits is -inf"):
        logprobs_of(np.full(2, -np.inf, np.float32), 0, 1)
    with pytest.raises(VkrtError, match=r"^the logits hold NaN \(at id 2\)"):
        logprobs_of(np.array([0.0, 1.0, np.nan], np.float32), 0, 1)


def test_penalties_by_hand():
    """`penalized` on 5 logits: repetition 2 over prompt and output ids (positive halved,
    negative doubled, each id once however often it occurs), then frequency 0.5 per
    occurrence and presence 1 once, over the output's ids only; ids outside the vocabulary
    (a pending token, -1) are skipped; no penalty leaves the logits as they are."""
    x = np.array([1.0, -1.0, 2.0, -2.0, 4.0], np.float32)
    got = penalized(x, [0, 1, 1], [2, 2, 3, -1], presence=1.0, frequency=0.5, repetition=2.0)
    want = [1.0 / 2, -1.0 * 2, 2.0 / 2 - 0.5 * 2 - 1, -2.0 * 2 - 0.5 - 1, 4.0]
    assert got.dtype == np.float32 and got.tolist() == want
    assert penalized(x, [0], [4, 4], presence=-1.0).tolist() == [1.0, -1.0, 2.0, -2.0, 5.0]
    assert np.array_equal(penalized(x, [0, 1], [2, 3]), x) and x[0] == 1.0   # a copy
    # logit_bias last: added after the penalties (not scaled by repetition).
    got = penalized(x, [0], [], repetition=2.0, bias=((0, 3.0), (4, -100.0)))
    assert got.tolist() == [1.0 / 2 + 3.0, -1.0, 2.0, -2.0, 4.0 - 100.0]


def test_sampling_follows_softmax():
    # Two tokens with logits 0 and log 3 at temperature 1: P(second) = 3/4.
    logits = np.array([0.0, np.log(3.0)], np.float32)
    gen = np.random.Generator(np.random.PCG64(1))
    draws = [_sample(logits, Sampling(1.0, 1.0, 1), gen) for _ in range(4000)]
    assert abs(np.mean(draws) - 0.75) < 0.03   # 4.4 standard errors of a 4000-draw mean


@pytest.mark.parametrize("kwargs, words", [
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    ({"temperature": -0.5}, "temperature must be a finite number >= 0"),
    ({"top_p": float("nan")}, "top_p must be in (0, 1]"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"seed": -1}, "seed must be an integer from 0 to 2**64 - 1"),
    ({"seed": 2 ** 64}, "seed must be an integer"),
    ({"seed": 1.5}, "seed must be an integer"),
])
def test_bad_sampling_refused(kwargs, words):
    with pytest.raises(ConfigError) as info:
        Sampling(**kwargs)
    assert words in str(info.value)


# --- end of turn -----------------------------------------------------------------------------

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def eot_model(tmp_path_factory, default_model_path):
    """The default model with EOS = <|endoftext|> (id 0) and EOT = <|im_end|> (id 2), as a
    model converted with a separate end-of-turn token declares them (gguf-py's own
    gguf_new_metadata script writes the copy)."""
    out = tmp_path_factory.mktemp("eot") / "eot.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--force",
                    "--special-token", "eos", "<|endoftext|>", "--special-token", "eot",
                    "<|im_end|>", default_model_path, str(out)], check=True, capture_output=True)
    return str(out)


def test_eot_model_metadata(eot_model):
    t = Tokenizer.from_metadata(load_gguf(eot_model).metadata)
    assert (t.eos_id, t.eog_ids) == (0, {0, 2})


def test_chat_stops_at_end_of_turn(eot_model, llama, tok, default_gguf):
    # The oracle: the same weights in process, stopped at <|im_end|> (id 2).
    template = default_gguf.metadata["tokenizer.chat_template"]
    ids = encode_chat(tok, template, [{"role": "user", "content": QUESTION}])
    expected = generate(llama, ids, 24, stop_ids={2}).tokens
    assert expected[-1] == 2 and len(expected) < 24 and "Paris" in tok.decode(expected)
    chat = subprocess.run([sys.executable, "-m", "vkrt.cli", "generate", QUESTION, "--chat",
                           "--max-tokens", "24", "--model", eot_model],
                          capture_output=True, text=True, timeout=600)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == tok.decode(expected, skip_special=True) + "\n"
    assert f"prompt {len(ids)} tokens, generated {len(expected)} tokens" in chat.stderr
    # A raw prompt spelling the rendered chat text: its special-token text becomes the special
    # tokens (README), so it is the same prompt and the same answer.
    raw = subprocess.run([sys.executable, "-m", "vkrt.cli", "generate",
                          render_chat(template, [{"role": "user", "content": QUESTION}]),
                          "--max-tokens", "24", "--model", eot_model],
                         capture_output=True, text=True, timeout=600)
    assert raw.returncode == 0, raw.stderr
    assert (raw.stdout, raw.stderr.split("]")[1].split(";")[0]) == \
        (chat.stdout, chat.stderr.split("]")[1].split(";")[0])
