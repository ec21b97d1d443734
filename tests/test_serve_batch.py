"""Continuous batching on the CPU: the KV-cache block manager, the scheduler, the batched
runner and the engine over `paged_fake.FakeModel` (a numpy model that emulates a paged KV
cache: a mixed-up block table, slot mapping, position or chunk changes its tokens). No GPU.
The engine is stepped by hand (`Engine.start(thread=False)`) except in the HTTP load test."""
import random
import threading
import time

import pytest

from paged_fake import EOS, FakeModel, logits_of, piece, reference
from vkrt.models.generate import logprobs_of
from vkrt.errors import VkrtError
from vkrt.serve import Engine, QueueFullError, SamplingParams
from vkrt.serve.engine import RequestError
from vkrt.serve.kv_cache import KVCacheManager


def engine_of(**kw) -> Engine:
    kw.setdefault("max_queue", 64)
    return Engine(FakeModel(kw.pop("n_ctx", 256)), **kw).start(thread=False)


class Collect:
    """A sink: token ids, text and finish reason per choice index; the outputs in order."""

    def __init__(self):
        self.tokens, self.text, self.reasons, self.outs = {}, {}, {}, []

    def __call__(self, out):
        self.outs.append(out)
        self.tokens.setdefault(out.index, []).extend(out.token_ids)
        self.text[out.index] = self.text.get(out.index, "") + out.delta
        if out.finished:
            self.reasons[out.index] = out.finish_reason

    @property
    def done(self):
        return bool(self.outs) and self.outs[-1].request_finished


def run_to_end(engine: Engine, max_steps: int = 10_000) -> int:
    """Step until nothing is left, checking the block tables after each step; the steps."""
    steps = 0
    while engine.has_unfinished():
        engine.step()
        engine.kv.check()
        steps += 1
        assert steps < max_steps
    return steps


def assert_no_block_leaked(engine: Engine):
    kv = engine.kv
    assert kv.num_free_blocks == kv.num_blocks and kv.num_allocated_blocks == 0
    assert kv.num_allocations == kv.num_frees
    kv.check()


# -- the block manager ---------------------------------------------------------------------

class _Seq:
    def __init__(self):
        self.num_computed_tokens = 0


def test_kv_manager_allocates_frees_and_refuses_when_short():
    kv = KVCacheManager(num_blocks=5, block_size=4)
    a, b = _Seq(), _Seq()
    assert kv.allocate_slots(a, 9)                   # 3 blocks for positions 0..8
    assert len(kv.block_table(a)) == 3 and kv.num_free_blocks == 2
    a.num_computed_tokens = 9
    assert kv.allocate_slots(a, 3)                   # 9..11 fit the third block
    assert len(kv.block_table(a)) == 3
    assert not kv.allocate_slots(b, 12)              # 3 blocks, 2 free: nothing taken
    assert kv.block_table(b) == [] and kv.num_free_blocks == 2
    assert kv.allocate_slots(b, 8)
    assert not set(kv.block_table(a)) & set(kv.block_table(b))
    kv.check()
    assert kv.slot(a, 5) == kv.block_table(a)[1] * 4 + 1
    with pytest.raises(VkrtError, match="no KV block"):
        kv.slot(a, 12)
    assert kv.free(a) == 3 and kv.num_free_blocks == 3 and kv.free(a) == 0
    a.num_computed_tokens = 0
    assert kv.allocate_slots(a, 12)                  # the freed blocks come back
    kv.free(a), kv.free(b)
    assert kv.num_free_blocks == 5 and kv.num_allocations == kv.num_frees == 8
    kv.check()
    # A pool of any size costs nothing until its blocks are used (a --kv-blocks far past
    # the device is refused by the model's allocation, not by the host running out).
    huge = KVCacheManager(num_blocks=10 ** 12, block_size=16)
    assert huge.allocate_slots(a, 40) and huge.block_table(a) == [0, 1, 2]
    assert huge.num_free_blocks == 10 ** 12 - 3


class _Prompt:
    """A sequence as the manager sees it: prompt ids, generated ids, computed positions."""

    def __init__(self, prompt, generated=()):
        self.token_ids = list(prompt) + list(generated)
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0


def admit(kv: KVCacheManager, seq: _Prompt) -> list[int]:
    """As the scheduler admits: the cached prefix, then the rest, then its blocks cached."""
    cached = kv.cached_prefix(seq)
    assert kv.allocate_slots(seq, len(seq.token_ids) - len(cached) * kv.block_size, cached)
    kv.cache_blocks(seq, len(seq.token_ids))
    seq.num_computed_tokens = len(seq.token_ids)
    kv.check()
    return cached


def test_kv_manager_caches_full_prompt_blocks_by_their_whole_prefix():
    """Prefix caching's bookkeeping: full prompt blocks are cached under a key that chains
    their whole prefix; a later prompt takes the longest cached prefix but never its last
    token's block; generated tokens' blocks are not cached; a cached block shared by two
    tables is counted twice and freed once both let go; freed cached blocks are handed out
    after the uncached ones, and evicted then."""
    kv = KVCacheManager(num_blocks=10, block_size=4)
    head = [1, 2, 3, 4, 5, 6, 7, 8]
    a = _Prompt(head + [9, 10], generated=[11, 12, 13, 14, 15, 16])
    assert admit(kv, a) == [] and kv.num_cached_blocks == 2   # [9, 10, 11, 12] holds outputs
    b = _Prompt(head + [20, 21, 22])
    assert admit(kv, b) == kv.block_table(a)[:2] and kv.num_hit_tokens == 8
    assert kv.num_allocated_blocks == 4 + 1 and kv.num_cached_blocks == 2
    assert kv.cached_prefix(_Prompt(head)) == kv.block_table(a)[:1]     # its last token's: no
    assert kv.cached_prefix(_Prompt(head + [0])) == kv.block_table(a)[:2]
    assert kv.cached_prefix(_Prompt([5, 6, 7, 8, 1])) == []    # a's second block, other parent
    assert kv.cached_prefix(_Prompt([1, 2, 3, 4, 1, 2, 3, 4, 0])) == kv.block_table(a)[:1]
    assert kv.free(a) == 4 and kv.num_free_blocks == 10 - 3    # the shared two stay b's
    assert kv.free(b) == 3 and kv.num_free_blocks == 10 and kv.num_cached_blocks == 2
    assert kv.num_allocations == kv.num_frees
    again = _Prompt(head + [30])
    assert admit(kv, again) == kv.block_table(again)[:2]       # out of the pool, still cached
    kv.free(again)
    # The 8 uncached blocks go first; the 9th evicts a cached one: the prefix's tail.
    head_block = kv.cached_prefix(_Prompt(head + [0]))[:1]
    big = _Prompt(list(range(100, 133)))
    admit(kv, big)
    assert kv.num_evictions == 1 and kv.cached_prefix(_Prompt(head + [0])) == head_block
    kv.free(big)
    off = KVCacheManager(num_blocks=4, block_size=4, prefix_caching=False)
    admit(off, _Prompt(head + [1]))
    assert off.num_cached_blocks == 0 and off.cached_prefix(_Prompt(head + [1])) == []
    kv.reset_prefix_cache()
    assert kv.num_cached_blocks == 0 and kv.cached_prefix(_Prompt(list(range(100, 133)))) == []
    kv.check()


# -- the engine: batch invariance, chunked prefill, admission, abort -----------------------

@pytest.mark.parametrize("async_scheduling", [True, False])
def test_concurrent_requests_equal_their_alone_run(async_scheduling):
    """12 requests of prompt lengths 1..45, greedy, max_batch 6 and 16 tokens a step (long
    prompts are chunked, sequences come and go every step): each gets exactly the tokens it
    gets alone, and every block is back in the pool at the end. Scheduled asynchronously,
    every engine step but the last submits a model step and every decode's token comes
    from the step before on the device."""
    rnd = random.Random(0)
    engine = engine_of(max_batch=6, block_size=4, max_batched_tokens=16,
                       async_scheduling=async_scheduling)
    cases = []
    for i in range(12):
        prompt = [rnd.randrange(1, 64) for _ in range(rnd.choice([1, 3, 7, 16, 29, 45]))]
        sink, max_tokens = Collect(), rnd.randrange(4, 20)
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens), sink)
        cases.append((prompt, max_tokens, sink))
    steps = run_to_end(engine)
    lm = engine.model.lm
    assert max(lm.seqs_per_step) == 6 and max(lm.tokens_per_step) == 16 and lm.setups == 1
    assert steps == lm.steps + async_scheduling
    # Fed: every decode, and at most one dropped token per sequence that stopped at EOS (its
    # next step was submitted before its EOS was seen).
    decodes = sum(len(sink.tokens[0]) - 1 for _, _, sink in cases)
    stopped = sum(sink.reasons[0] == "stop" for _, _, sink in cases)
    assert lm.fed_tokens == engine.runner.fed_tokens
    if async_scheduling:
        assert decodes <= lm.fed_tokens <= decodes + stopped and stopped
    else:
        assert lm.fed_tokens == 0
    for i, (prompt, max_tokens, sink) in enumerate(cases):
        want = reference(prompt, max_tokens)
        assert sink.tokens[0] == want, i
        assert sink.text[0] == "".join(map(piece, want))
        assert sink.done and sink.reasons[0] == ("stop" if want[-1] == EOS else "length")
    assert_no_block_leaked(engine)


def test_lengths_are_each_requests_own():
    engine = engine_of(max_batch=4, block_size=4, max_batched_tokens=8)
    sinks = []
    for n in (3, 9, 5, 12):
        sinks.append((n, Collect()))
        engine.add_request([5, 6, 7, 8, 9][: 1 + n % 5], SamplingParams(max_tokens=n),
                           sinks[-1][1])
    run_to_end(engine)
    for n, sink in sinks:
        prompt = [5, 6, 7, 8, 9][: 1 + n % 5]
        assert sink.tokens[0] == reference(prompt, n)
    assert_no_block_leaked(engine)


def test_chunked_prefill_across_steps_with_a_decode_first():
    """A running decode takes 1 token of the 8 a step; a 30-token prompt is prefilled in
    chunks of 7 over 5 steps (7+7+7+7+2), then decodes; both equal their alone runs.
    (Synchronous scheduling: each step's outputs arrive in that step.)"""
    engine = engine_of(max_batch=2, block_size=4, max_batched_tokens=8, async_scheduling=False)
    lm = engine.model.lm
    short, long = [3, 1, 4], list(range(1, 31))
    a, b = Collect(), Collect()
    engine.add_request(short, SamplingParams(max_tokens=12), a)
    engine.step()                                  # a's prompt: 3 tokens, first token
    assert lm.tokens_per_step == [3] and len(a.tokens[0]) == 1
    engine.add_request(long, SamplingParams(max_tokens=4), b)
    for _ in range(4):
        engine.step()
        assert b.outs == []                         # no token while the prompt is chunked
    engine.step()
    assert lm.tokens_per_step[1:] == [8, 8, 8, 8, 3] and len(b.tokens[0]) == 1
    assert lm.seqs_per_step[1:] == [2] * 5
    run_to_end(engine)
    assert a.tokens[0] == reference(short, 12) and b.tokens[0] == reference(long, 4)
    assert_no_block_leaked(engine)


def test_admission_waits_for_blocks_and_refuses_what_never_fits():
    """6 blocks of 4 slots. The first request's 20-token prompt takes 5 blocks and grows into
    the sixth; the second's first chunk (8 tokens, 2 blocks) does not fit: it waits, with no
    block, until the first finished and freed its blocks, then runs."""
    engine = engine_of(max_batch=4, block_size=4, kv_blocks=6)
    a, b = Collect(), Collect()
    p1, p2 = list(range(1, 21)), [2] * 8
    engine.add_request(p1, SamplingParams(max_tokens=4), a)
    engine.add_request(p2, SamplingParams(max_tokens=9), b)
    waiting_b = engine.scheduler.waiting[1]
    while True:
        engine.step()
        if a.done:
            break
        load = engine.load()
        assert (load["running"], load["waiting"]) == (1, 1) and b.outs == []
        assert engine.kv.block_table(waiting_b) == []
    run_to_end(engine)
    assert a.tokens[0] == reference(p1, 4) and b.tokens[0] == reference(p2, 9)
    assert engine.scheduler.num_preemptions == 0
    assert_no_block_leaked(engine)
    with pytest.raises(VkrtError, match="needs 7 KV blocks of 4 tokens.*holds 6"):
        engine.add_request([1] * 20, SamplingParams(max_tokens=6), Collect())
    assert engine.load()["waiting"] == 0


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("sampled", [True, False], ids=["with-sampled", "greedy"])
def test_preemption_by_recompute_keeps_every_sequence_exact(sampled, prefix_caching):
    """8 blocks of 4 slots (32 positions) for sequences that grow to 8 + 14 - 1 = 21
    positions each: once they outgrow the pool the latest admitted is preempted, its
    blocks freed, and it recomputes prompt + output later. Greedy and seeded sampled
    sequences still equal their alone runs token for token; nothing leaks. Greedy only,
    every step overlaps the next (asynchronous scheduling): a sequence is preempted while
    the step that samples its last token is in flight, and recomputes with that token.
    With prefix caching, a preempted sequence may take its own prompt blocks back."""
    engine = engine_of(max_batch=4, block_size=4, kv_blocks=8, max_batched_tokens=8,
                       prefix_caching=prefix_caching)
    prompts = [[i + 1] * 8 for i in range(3)]
    sinks = [Collect() for _ in range(4)]
    for p, sink in zip(prompts, sinks):
        engine.add_request(p, SamplingParams(max_tokens=14), sink)
    if sampled:
        engine.add_request(prompts[0], SamplingParams(max_tokens=14, temperature=1.0, seed=3,
                                                      n=2), sinks[3])
    run_to_end(engine)
    assert engine.scheduler.num_preemptions >= (2 if sampled else 1)
    for p, sink in zip(prompts, sinks):
        assert sink.tokens[0] == reference(p, 14)
    if sampled:
        assert sinks[3].tokens == {i: reference(prompts[0], 14, 1.0, 1.0, 3 + i)
                                   for i in (0, 1)}
    else:
        assert engine.runner.fed_tokens > 0
    assert_no_block_leaked(engine)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prefix_cache_hits_give_each_request_its_alone_tokens(async_scheduling):
    """Prompts that share leading blocks (a system prompt, a conversation's history, `n`
    choices of one prompt): later ones take the cached blocks and compute the rest, and
    every request still gets exactly its tokens alone (the fake model's logits hash each
    position's (id, position, role) history, so a wrong block changes them). Cases: a hit
    after the first request finished; `n` = 3, whose choices 1 and 2 take choice 0's blocks
    in the step that computes them; the same prompt again, a whole number of blocks (its
    last block is computed again); a block with a cached block's ids at another place in
    the prompt (no hit); a prompt computed in chunks over several steps."""
    engine = engine_of(max_batch=4, block_size=4, max_batched_tokens=16,
                       async_scheduling=async_scheduling)
    system = [5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    cases = [(system + [1, 2, 3], {}), (system + [4, 4], {"n": 3}), (system[:8], {}),
             (system[:8], {}), (system[4:8] + system[:4] + [1], {}),
             (system + list(range(10, 40)), {}), (system + list(range(10, 40)) + [1], {}),
             (list(range(50, 63)), {"n": 3})]
    # A conversation's next turn: its first prompt, the reply, a new message. The reply's
    # positions were generated tokens (another role): only the first prompt's blocks hit.
    turn = system + [1, 2, 3]
    cases.append((turn + reference(turn, 6) + [7, 7], {}))
    sinks, hits, cached = [], [], []
    for prompt, kw in cases:
        sink = Collect()
        before = engine.kv.num_hit_tokens
        engine.add_request(prompt, SamplingParams(max_tokens=6, **kw), sink)
        run_to_end(engine)
        hits.append(engine.kv.num_hit_tokens - before)
        sinks.append(sink)
        for i in range(kw.get("n", 1)):
            assert sink.tokens[i] == reference(prompt, 6), (prompt, i)
        cached.append(sink.outs[-1].cached_tokens)
    # system[:8] is two blocks: the second time only its first is taken. Every choice of
    # the first n = 3 takes the system prompt's two blocks (the third is its last token's);
    # of the second, choices 1 and 2 take the three blocks choice 0 computes in their step.
    assert hits == [0, 3 * 8, 4, 4, 0, 8, 40, 2 * 12, 12], hits
    assert cached == [0, 8, 4, 4, 0, 8, 40, 0, 12], cached     # the first choice's
    assert engine.load()["prefix_cache_hit_tokens"] == sum(hits)
    assert engine.load()["kv_cached_blocks"] == engine.kv.num_cached_blocks > 0
    assert_no_block_leaked(engine)


def test_prefix_cache_off_and_reset_by_a_failed_step():
    """`prefix_caching=False` takes nothing from the cache; a step that fails leaves the
    blocks it was to fill empty, so the cache forgets its keys (a later prompt that takes
    them would read unwritten slots: the fake model raises)."""
    off = engine_of(max_batch=2, block_size=4, prefix_caching=False)
    for _ in range(2):
        sink = Collect()
        off.add_request(list(range(1, 12)), SamplingParams(max_tokens=3), sink)
        run_to_end(off)
        assert sink.tokens[0] == reference(list(range(1, 12)), 3)
    assert off.kv.num_hit_tokens == 0 and off.kv.num_cached_blocks == 0
    engine = engine_of(max_batch=2, block_size=4)
    lm, submit = engine.model.lm, engine.model.lm.submit_batch

    def broken(batch, want_logits=False):
        raise RuntimeError("device lost")

    lm.submit_batch = broken
    a = Collect()
    engine.add_request(list(range(1, 12)), SamplingParams(max_tokens=3), a)
    engine.step()
    assert a.outs[-1].finish_reason == "error"
    lm.submit_batch = submit
    b = Collect()
    engine.add_request(list(range(1, 12)), SamplingParams(max_tokens=3), b)
    run_to_end(engine)
    assert b.tokens[0] == reference(list(range(1, 12)), 3) and engine.kv.num_hit_tokens == 0
    assert_no_block_leaked(engine)


def reference_logprobs(prompt: list[int], tokens: list[int], k: int):
    """(logprob, top k) of each of `tokens` generated after `prompt`, from the fake model's
    logits of its unpaged history."""
    hist, out = list(prompt), []
    for t in tokens:
        logits = logits_of([(v, q, q < len(prompt)) for q, v in enumerate(hist)])
        out.append(logprobs_of(logits, t, k))
        hist.append(t)
    return out


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_logprobs_are_each_tokens_own_in_any_batch(async_scheduling):
    """Requests with logprobs (0, 3 and 20 alternatives; greedy and sampled) beside ones
    without, prompts chunked: each generated token comes with its log-probability and top
    ids as its sequence's logits alone give them, texts included, and the tokens are still
    each request's alone. A step with a logprobs request is collected before the next is
    scheduled (its logits go to the host)."""
    engine = engine_of(max_batch=4, block_size=4, max_batched_tokens=8,
                       async_scheduling=async_scheduling)
    cases = [([3, 1, 4, 1, 5], {"logprobs": 3}), ([9, 2, 6], {}),
             ([5, 3, 5, 8, 9, 7, 9, 3, 2, 3], {"logprobs": 0}),
             ([2, 7, 1], {"logprobs": 20, "temperature": 1.0, "seed": 4, "n": 2})]
    sinks = []
    for prompt, kw in cases:
        sinks.append(Collect())
        engine.add_request(prompt, SamplingParams(max_tokens=7, **kw), sinks[-1])
    run_to_end(engine)
    for (prompt, kw), sink in zip(cases, sinks):
        for i in range(kw.get("n", 1)):
            want = reference(prompt, 7, kw.get("temperature", 0.0), 1.0,
                             None if "seed" not in kw else kw["seed"] + i)
            assert sink.tokens[i] == want
            got = [e for o in sink.outs if o.index == i for e in (o.logprobs or [])]
            if "logprobs" not in kw:
                assert got == [] and all(o.logprobs is None for o in sink.outs)
                continue
            assert [e.token_id for e in got] == want
            assert [e.token for e in got] == [piece(t) for t in want]
            for e, (lp, top) in zip(got, reference_logprobs(prompt, want, kw["logprobs"])):
                assert e.logprob == lp and [(i, v) for i, _, v in e.top] == top
                assert [t for _, t, _ in e.top] == [piece(i) for i, _ in top]
            if "temperature" not in kw and kw["logprobs"]:
                assert all(e.top[0][0] == e.token_id for e in got)   # greedy: the argmax
    assert_no_block_leaked(engine)
    sink = never_in_flight(engine, SamplingParams(max_tokens=5, logprobs=1))
    assert len([e for o in sink.outs for e in o.logprobs or []]) == 5


def run_cases(engine: Engine, cases, max_tokens: int) -> list[Collect]:
    """Queue every (prompt, SamplingParams keywords) of `cases` at once, `max_tokens` each
    past end-of-generation ids, and step to the end; their sinks."""
    sinks = []
    for prompt, kw in cases:
        sinks.append(Collect())
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                                  **kw), sinks[-1])
    run_to_end(engine)
    return sinks


def never_in_flight(engine: Engine, params: SamplingParams) -> Collect:
    """Run one request of `params` alone, asserting after every engine step that no step
    was left in flight (its logits had to reach the host). Returns its outputs."""
    sink = Collect()
    engine.add_request([4, 4], params, sink)
    while engine.has_unfinished():
        engine.step()
        assert engine._in_flight is None
    return sink


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_prompt_logprobs_come_with_the_first_token(async_scheduling):
    """`prompt_logprobs`: every prompt token from the second on gets its log-probability
    and top ids given the tokens before it, with the sequence's first output, computed over
    chunks (prompts longer than a step's budget) and for each of `n` choices, not again
    after a preemption; a prompt the prefix cache holds is computed again for them; the
    generated tokens are still each request's alone."""
    engine = engine_of(max_batch=3, block_size=4, kv_blocks=10, max_batched_tokens=8,
                       async_scheduling=async_scheduling)
    long = [5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]
    warm = Collect()
    engine.add_request(long, SamplingParams(max_tokens=2), warm)    # the prefix cache has it
    run_to_end(engine)
    cases = [(long, {"prompt_logprobs": 2, "logprobs": 1}), ([7], {"prompt_logprobs": 0}),
             ([4, 2, 4, 2, 4], {"prompt_logprobs": 3, "n": 2}), ([1, 1, 2], {})]
    sinks = run_cases(engine, cases, max_tokens=10)
    assert engine.scheduler.num_preemptions >= 1
    for (prompt, kw), sink in zip(cases, sinks):
        for i in range(kw.get("n", 1)):
            outs = [o for o in sink.outs if o.index == i and o.token_ids]
            assert sink.tokens[i] == reference(prompt, 10, stop_at_eos=False)
            if "prompt_logprobs" not in kw:
                assert all(o.prompt_logprobs is None for o in outs)
                continue
            got = outs[0].prompt_logprobs
            assert all(o.prompt_logprobs is None for o in outs[1:])
            assert len(got) == len(prompt)
            assert (got[0].token_id, got[0].logprob, got[0].top) == (prompt[0], None, ())
            for q in range(1, len(prompt)):
                lp, top = logprobs_of(logits_of([(t, p, True) for p, t in
                                                 enumerate(prompt[:q])]),
                                      prompt[q], kw["prompt_logprobs"])
                e = got[q]
                assert (e.token_id, e.token, e.logprob) == (prompt[q], piece(prompt[q]), lp)
                assert [(j, v) for j, _, v in e.top] == top
    assert sinks[0].outs[-1].cached_tokens == 0
    assert_no_block_leaked(engine)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_penalties_are_each_sequences_own_in_any_batch(async_scheduling):
    """Penalized requests (greedy and seeded, with logprobs) beside plain ones, prompts
    chunked and a sequence preempted: each gets the tokens its penalized logits give alone,
    counting its own prompt and output only; its logprobs stay the model's. A penalized
    step is collected before the next is scheduled."""
    engine = engine_of(max_batch=4, block_size=4, kv_blocks=12, max_batched_tokens=8,
                       async_scheduling=async_scheduling)
    # A prompt that holds its own greedy first token, which a repetition penalty of 3 (over
    # the prompt's ids too) turns away from.
    echo = next(p for p in ([a, b, c, a] for a in range(1, 9) for b in range(1, 9)
                            for c in range(1, 9))
                if reference(p, 1)[0] in p
                and reference(p, 1, penalties=(0.0, 0.0, 3.0)) != reference(p, 1))
    cases = [([3, 1, 4, 1, 5], {"frequency_penalty": -2.0, "presence_penalty": -1.0}),
             ([3, 1, 4, 1, 5], {}),
             (echo, {"repetition_penalty": 3.0, "logprobs": 2}),
             ([2, 7, 1], {"presence_penalty": -2.0, "temperature": 1.0, "seed": 9, "n": 2})]
    sinks = run_cases(engine, cases, max_tokens=12)
    for (prompt, kw), sink in zip(cases, sinks):
        pen = (kw.get("presence_penalty", 0.0), kw.get("frequency_penalty", 0.0),
               kw.get("repetition_penalty", 1.0))
        for i in range(kw.get("n", 1)):
            want = reference(prompt, 12, kw.get("temperature", 0.0), 1.0,
                             None if "seed" not in kw else kw["seed"] + i,
                             pen if pen != (0.0, 0.0, 1.0) else None, stop_at_eos=False)
            assert sink.tokens[i] == want, (prompt, kw, i)
    assert sinks[0].tokens[0] != sinks[1].tokens[0]       # the penalty changed something
    forced, banned = Collect(), Collect()
    engine.add_request([3, 1, 4], SamplingParams(max_tokens=5, logit_bias={5: 100.0}), forced)
    first = reference([3, 1, 4], 1)[0]
    engine.add_request([3, 1, 4], SamplingParams(max_tokens=1, logit_bias={first: -100}), banned)
    run_to_end(engine)
    assert forced.tokens[0] == [5] * 5 and banned.tokens[0] != [first]
    with pytest.raises(VkrtError, match="logit_bias: token id 64 is past the vocabulary of 64"):
        engine.add_request([1], SamplingParams(logit_bias={64: 1.0}), Collect())
    got = [e for o in sinks[2].outs for e in o.logprobs or []]
    for e, (lp, top) in zip(got, reference_logprobs(cases[2][0], sinks[2].tokens[0], 2)):
        assert e.logprob == lp and [(i, v) for i, _, v in e.top] == top
    assert engine.scheduler.num_preemptions >= 1
    assert_no_block_leaked(engine)
    never_in_flight(engine, SamplingParams(max_tokens=4, frequency_penalty=1.0))


def test_shutdown_collects_the_step_in_flight():
    """An engine stepped by hand and shut down with a step in flight waits for it and drops
    its tokens; the next engine on the model runs as if alone."""
    model = FakeModel()
    engine = Engine(model, max_batch=2, block_size=4).start(thread=False)
    engine.add_request([3, 1, 4], SamplingParams(max_tokens=8), Collect())
    engine.step()
    engine.step()
    assert engine._in_flight is not None
    engine.shutdown()
    assert engine._in_flight is None
    again, a = Engine(model, max_batch=2, block_size=4).start(thread=False), Collect()
    again.add_request([3, 1, 4], SamplingParams(max_tokens=8), a)
    run_to_end(again)
    assert a.tokens[0] == reference([3, 1, 4], 8)


def test_abort_frees_the_blocks_within_one_step():
    engine = engine_of(max_batch=4, block_size=4)
    kv = engine.kv
    a, b = Collect(), Collect()
    ra = engine.add_request(list(range(1, 20)), SamplingParams(max_tokens=30), a)
    engine.add_request([7, 7, 7], SamplingParams(max_tokens=8), b)
    for _ in range(3):
        engine.step()
    other = engine.scheduler.running[1]
    held = len(kv.block_table(ra.seqs[0]))
    assert held == 6 and kv.num_free_blocks == kv.num_blocks - held - len(
        kv.block_table(other))
    engine.abort(ra.request_id)
    engine.step()                                   # the one step after the abort
    assert a.outs[-1].finish_reason == "abort" and a.outs[-1].request_finished
    assert kv.block_table(ra.seqs[0]) == []
    assert kv.num_free_blocks == kv.num_blocks - len(kv.block_table(other))
    assert engine.load()["running"] == 1
    run_to_end(engine)
    assert b.tokens[0] == reference([7, 7, 7], 8)
    assert_no_block_leaked(engine)
    assert engine.stats["aborted"] == 1


def test_queue_full_counts_requests_not_sequences():
    engine = engine_of(max_queue=2, max_batch=2)
    engine.add_request([1, 2], SamplingParams(max_tokens=2, n=3), Collect())
    engine.add_request([1, 2], SamplingParams(max_tokens=2), Collect())
    with pytest.raises(QueueFullError, match="--max-queue 2"):
        engine.add_request([1, 2], SamplingParams(max_tokens=2), Collect())
    engine.step()           # the first request's sequences are admitted: one waits
    engine.add_request([1, 2], SamplingParams(max_tokens=2), Collect())
    run_to_end(engine)
    assert_no_block_leaked(engine)


def test_n_sequences_and_seeded_sampling_are_reproducible_in_any_batch():
    """n=3 sampled at temperature 0.8, top_p 0.9, seed 5: choice i equals the alone run with
    seed 5 + i, batched together and with other requests around, and again the same."""
    prompt = [9, 8, 7, 6, 5]
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=5, n=3)
    want = {i: reference(prompt, 12, 0.8, 0.9, 5 + i) for i in range(3)}
    assert len({tuple(w) for w in want.values()}) == 3
    for others in (0, 5):
        engine = engine_of(max_batch=8, block_size=4, max_batched_tokens=12)
        sink = Collect()
        for k in range(others):
            engine.add_request([k + 1] * (k + 2), SamplingParams(max_tokens=6,
                                                                 temperature=1.0), Collect())
        engine.add_request(prompt, params, sink)
        run_to_end(engine)
        assert sink.tokens == want and set(sink.reasons) == {0, 1, 2}
        assert sink.outs[-1].completion_tokens == sum(map(len, want.values()))
        assert max(engine.model.lm.seqs_per_step) >= 3
        assert_no_block_leaked(engine)


def test_a_model_without_execute_batch_runs_one_sequence():
    model = FakeModel(batched=False)
    with pytest.raises(VkrtError, match="--max-batch must be 1"):
        Engine(model, max_batch=4)
    engine = Engine(model).start(thread=False)
    assert engine.kv is None and engine.max_batch == 1 and engine.scheduler.max_num_seqs == 1
    # What its token loop cannot do is refused by name, not ignored.
    for kw, field in (({"logprobs": 1}, "logprobs"), ({"prompt_logprobs": 0}, "prompt_logprobs"),
                      ({"frequency_penalty": 1.0}, "frequency_penalty"),
                      ({"repetition_penalty": 1.2}, "repetition_penalty"),
                      ({"logit_bias": {3: 1.0}}, "logit_bias")):
        with pytest.raises(RequestError, match=f"^{field} needs a model with a batched") as e:
            engine.add_request([1, 2], SamplingParams(**kw), Collect())
        assert e.value.param == field
    engine.shutdown()


def test_stop_strings_are_each_sequences_own():
    """Two requests decoding together, one with a stop string spanning two of its tokens:
    its text ends before it ("stop"), its blocks are freed, the other runs on untouched."""
    engine = engine_of(max_batch=2, block_size=4)
    pa, pb = [4, 4, 2], [6, 1]
    want_a, want_b = reference(pa, 12), reference(pb, 12)
    text_a = "".join(map(piece, want_a))
    cut = len(piece(want_a[0])) + len(piece(want_a[1]))
    stop = text_a[cut - 2:cut + 2]                   # the end of token 1, the start of 2
    assert text_a.find(stop) == cut - 2
    a, b = Collect(), Collect()
    engine.add_request(pa, SamplingParams(max_tokens=12, stop=stop), a)
    engine.add_request(pb, SamplingParams(max_tokens=12), b)
    run_to_end(engine)
    assert a.text[0] == text_a[:cut - 2] and a.reasons[0] == "stop"
    assert a.tokens[0] == want_a[:3]                 # stopped at the token that completed it
    assert b.text[0] == "".join(map(piece, want_b)) and b.tokens[0] == want_b
    assert_no_block_leaked(engine)


def test_engine_options_and_their_defaults():
    from vkrt.serve.engine import default_kv_blocks

    assert default_kv_blocks(8192, 8, 16) == 8 * 2048 // 16      # 8 sequences of 2048
    assert default_kv_blocks(256, 8, 16) == 8 * 256 // 16        # 8 of the whole context
    assert default_kv_blocks(8192, 1, 16) == 8192 // 16          # one of the whole context
    engine = Engine(FakeModel(n_ctx=256), max_batch=3, block_size=8)
    assert (engine.kv.num_blocks, engine.kv.block_size) == (3 * 256 // 8, 8)
    assert engine.scheduler.max_num_batched_tokens == 256
    for kw, words in [(dict(max_batch=8, max_batched_tokens=4), "--max-batched-tokens"),
                      (dict(max_batch=0), "--max-batch"), (dict(block_size=0), "block_size"),
                      (dict(kv_blocks=0), "num_blocks")]:
        with pytest.raises(VkrtError, match=words):
            Engine(FakeModel(), **kw)


def test_kv_cache_sized_to_the_device_and_allocated_when_the_engine_is_made(monkeypatch):
    """The default KV cache takes what the device holds where that is less than the default
    room (vLLM sizes its cache to the memory the same way); the cache is allocated when the
    engine is made, so one that does not fit is a VkrtError naming --kv-blocks then, never a
    server that starts and fails every request; an engine of the same blocks keeps the
    model's cache, one of another dtype allocates it anew. (The fake's device: 40 token
    slots.)"""
    from paged_fake import FakePagedLM

    monkeypatch.setattr(FakePagedLM, "max_slots", 40)
    model = FakeModel(n_ctx=256)
    engine = Engine(model, max_batch=3, block_size=8)          # room wanted: 96 blocks
    assert engine.kv.num_blocks == 5 and model.lm.setups == 1   # before any request
    assert engine.kv_capped_from == 96
    Engine(model, max_batch=3, block_size=8)     # the same blocks: the model left alone
    assert model.lm.setups == 1
    engine.start(thread=False)
    a = Collect()
    engine.add_request([5] * 20, SamplingParams(max_tokens=8), a)
    while engine.has_unfinished():
        engine.step()
    assert a.tokens[0] == reference([5] * 20, 8)
    with pytest.raises(VkrtError, match="KV blocks of 8 tokens; the whole cache holds 5"):
        engine.add_request([5] * 40, SamplingParams(max_tokens=2), a)
    with pytest.raises(VkrtError, match=r"the paged KV cache \(6 blocks of 8 token slots, "
                                        r"f32\) cannot be allocated: .*40 fit; 5 blocks fit "
                                        r"in 90% of this device's memory, the default's bound "
                                        r"\(--kv-blocks\)"):
        Engine(FakeModel(n_ctx=256), max_batch=3, block_size=8, kv_blocks=6)
    engine.shutdown()
    f16 = Engine(model, max_batch=3, block_size=8, kv_cache_dtype="f16")   # another dtype:
    assert model.lm.setups == 2 and model.lm.paged_kv_dtype == "float16"   # allocated anew
    assert f16.kv_cache_dtype == "f16"
    with pytest.raises(VkrtError, match="--kv-cache-dtype must be one of f32, f16, got 'f8'"):
        Engine(model, kv_cache_dtype="f8")
    with pytest.raises(VkrtError, match="--kv-cache-dtype are not used"):
        Engine(FakeModel(batched=False), kv_cache_dtype="f16")
    monkeypatch.setattr(FakePagedLM, "max_slots", 7)
    with pytest.raises(VkrtError, match="no KV block of 8 token slots fits"):
        Engine(FakeModel(n_ctx=256), block_size=8)


def test_engine_fixes_the_products_kernels_by_max_batch():
    """The engine's max_batch chooses the products' kernels (the fake's table: "wide" from 16
    sequences) and matmul_coop's tiles (another split from 64), which the paged cache keeps:
    an engine of another max_batch but the same kernels and tiles keeps the model's cache;
    one whose kernels or tiles differ sets it up anew (its steps captured again); a running
    engine whose kernels were replaced by hand refuses its step."""
    model = FakeModel(n_ctx=256)
    narrow = Engine(model, max_batch=3, block_size=8, kv_blocks=5)
    assert model.lm.paged_products["decode"] == "narrow" and model.lm.setups == 1
    Engine(model, max_batch=8, block_size=8, kv_blocks=5)
    assert model.lm.setups == 1                   # the same kernels: the cache kept
    wide = Engine(model, max_batch=16, block_size=8, kv_blocks=5)
    assert model.lm.paged_products["decode"] == "wide" and model.lm.setups == 2
    wide.start(thread=False)
    a = Collect()
    wide.add_request([5] * 3, SamplingParams(max_tokens=2), a)
    run_to_end(wide)
    assert a.tokens[0] == reference([5] * 3, 2)
    model.lm.setup_paged_cache(5, 8)              # the narrow kernels, by hand
    b = Collect()
    wide.add_request([5] * 3, SamplingParams(max_tokens=2), b)
    wide.step()
    assert b.done and "KV cache was replaced" in b.outs[-1].error
    wide.shutdown()
    narrow.start(thread=False)
    assert model.lm.paged_products["decode"] == "narrow"
    narrow.shutdown()
    # The same kernels, other matmul_coop tiles (the fake's split from 64 sequences): set up
    # anew, and the tiles the cache holds are the engine's.
    Engine(model, max_batch=16, block_size=8, kv_blocks=5)
    setups = model.lm.setups
    Engine(model, max_batch=64, block_size=8, kv_blocks=5)
    assert model.lm.setups == setups + 1
    tiles = model.lm.batch_coop_tiles
    assert model.lm.paged_coop_tiles == tiles(64) != tiles(16)


def test_one_engine_runs_a_model_at_a_time():
    """While an engine runs a model (started, not shut down), another engine with another
    cache is refused (the model untouched) and a second engine cannot start; once it is shut
    down, others may replace the cache; a step whose cache was replaced by hand fails its
    requests, naming it."""
    model = FakeModel(n_ctx=256)
    engine = Engine(model, max_batch=3, block_size=8, kv_blocks=5).start(thread=False)
    with pytest.raises(VkrtError, match=r"the model runs in another engine, whose KV cache "
                                        r"has 5 blocks of 8 \(float32, max_batch 3\): shut "
                                        r"it down before making one with 96 blocks of 8 "
                                        r"\(float16, max_batch 3\)"):
        Engine(model, max_batch=3, block_size=8, kv_cache_dtype="f16")
    same = Engine(model, max_batch=3, block_size=8, kv_blocks=5)
    with pytest.raises(VkrtError, match="already runs in another engine"):
        same.start(thread=False)
    assert model.lm.setups == 1
    engine.shutdown()
    Engine(model, max_batch=3, block_size=8, kv_blocks=5, kv_cache_dtype="f16")
    assert model.lm.setups == 2 and model.lm.paged_kv_dtype == "float16"
    same.start(thread=False)                 # the f16 one never started: same takes it back
    assert model.lm.setups == 3 and model.lm.paged_kv_dtype == "float32"
    model.lm.setup_paged_cache(4, 8)         # replaced under the running engine, by hand:
    b = Collect()                            # its step fails, naming it, no garbage
    same.add_request([5] * 3, SamplingParams(max_tokens=2), b)
    same.step()
    assert b.done and "KV cache was replaced" in b.outs[-1].error
    same.shutdown()


def test_a_failing_step_fails_its_requests_and_frees_their_blocks():
    engine = engine_of(max_batch=2, block_size=4)
    a = Collect()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=5), a)

    def broken(batch, want_logits=False):
        raise RuntimeError("device lost")

    engine.model.lm.submit_batch = broken
    engine.step()
    assert a.outs[-1].finish_reason == "error" and "device lost" in a.outs[-1].error
    assert_no_block_leaked(engine)


# -- HTTP: many streaming clients through the openai client --------------------------------

def test_http_load_64_streaming_clients():
    """64 streaming clients at once on loopback (the real app and uvicorn, the fake model):
    greedy ones and seeded n=2 ones, 8 of which hang up after their first chunk. Every
    completed client gets exactly its alone-run text and token count; nothing is left
    running; no block leaked. Prints p50/p99 TTFT and TPOT as the clients saw them."""
    from test_serve import Server

    model = FakeModel(n_ctx=256)
    # Each step takes >= 10 ms, and every hang-up request's greedy run has no EOS in its 200
    # tokens (>= 2 s): its client's hang-up (after the first chunk) always lands while it
    # runs, however slowly the client threads are scheduled.
    model.lm.delay_s = 0.01
    engine = Engine(model, max_queue=64, max_batch=16, block_size=8).start()
    server = Server(engine, "fake")
    rnd = random.Random(1)
    jobs = []
    for i in range(64):
        sampled = i % 4 == 0
        hang_up = i % 8 == 1
        while True:
            prompt = [rnd.randrange(1, 64) for _ in range(rnd.randrange(1, 40))]
            if not hang_up or len(reference(prompt, 200)) == 200:
                break
        jobs.append(dict(prompt=prompt, max_tokens=200 if hang_up else rnd.randrange(8, 24),
                         temperature=1.0 if sampled else 0.0, seed=i if sampled else None,
                         n=2 if sampled else 1, hang_up=hang_up))
    results = [None] * len(jobs)

    def client(i, job):
        t0 = time.perf_counter()
        stream = server.client.completions.create(
            model="fake", prompt=job["prompt"], max_tokens=job["max_tokens"],
            temperature=job["temperature"], seed=job["seed"], n=job["n"], stream=True,
            stream_options={"include_usage": True})
        texts, times, usage = {}, [], None
        for c in stream:
            if c.usage is not None:
                usage = c.usage
            for ch in c.choices:
                if ch.text:
                    texts[ch.index] = texts.get(ch.index, "") + ch.text
                    times.append(time.perf_counter() - t0)
            if job["hang_up"] and times:
                stream.close()
                break
        results[i] = (texts, times, usage)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i, j), daemon=True)
               for i, j in enumerate(jobs)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.1, 45 - (time.monotonic() - t0)))
        elapsed = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads), "clients still running after 45 s"
        deadline = time.monotonic() + 5
        while engine.load()["running"] or engine.load()["waiting"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        server.stop()
        engine.shutdown(10)
    ttft, tpot = [], []
    for job, (texts, times, usage) in zip(jobs, results):
        if job["hang_up"]:
            assert times
            continue
        want = {i: reference(job["prompt"], job["max_tokens"], job["temperature"], 1.0,
                             None if job["seed"] is None else job["seed"] + i)
                for i in range(job["n"])}
        assert texts == {i: "".join(map(piece, w)) for i, w in want.items()}
        assert usage.completion_tokens == sum(map(len, want.values()))
        ttft.append(times[0])
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
    assert_no_block_leaked(engine)
    # A client that hangs up before its request ends aborts it (one may end first, at EOS).
    assert engine.stats["aborted"] + engine.stats["finished"] == 64
    assert engine.stats["aborted"] >= 1 and max(model.lm.seqs_per_step) > 8

    def pct(xs, p):
        return sorted(xs)[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1e3

    print(f"\n64 clients in {elapsed:.1f} s, {model.lm.steps} steps: TTFT p50 "
          f"{pct(ttft, 50):.0f} ms p99 {pct(ttft, 99):.0f} ms; TPOT p50 {pct(tpot, 50):.1f} ms "
          f"p99 {pct(tpot, 99):.1f} ms (client side)")
    assert elapsed < 45


def test_shutdown_ends_open_requests_while_a_step_runs_long():
    """Shut down while the engine is inside a step longer than the grace uvicorn gives after
    the drain (CANCEL_GRACE_S; a big model on a slow device): every open request still ends
    in order at once: the non-streamed one with a 503 `shutting_down` JSON error, the stream
    with an error event and `data: [DONE]`, neither cut by uvicorn's task cancellation."""
    import json as _json
    import urllib.error
    import urllib.request

    import uvicorn  # noqa: F401 (the server below is uvicorn's)
    from vkrt.serve.app import CANCEL_GRACE_S, build_app, server as draining_server

    model = FakeModel()
    model.lm.delay_s = CANCEL_GRACE_S + 1.5
    engine = Engine(model, max_queue=8, max_batch=4, block_size=4)
    srv = draining_server(engine, build_app(engine, "fake", owns_engine=True), 0.0,
                          host="127.0.0.1", port=0, log_level="critical")
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    url = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}/v1/completions"
    got = {}

    def call(stream):
        body = _json.dumps({"prompt": [1, 2, 3], "max_tokens": 50, "stream": stream}).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                got[stream] = (r.status, r.read().decode())
        except urllib.error.HTTPError as e:
            got[stream] = (e.code, e.read().decode())

    clients = [threading.Thread(target=call, args=(s,), daemon=True) for s in (False, True)]
    for c in clients:
        c.start()
    while engine.load()["running"] < 2:        # both inside the engine's first (long) step
        assert time.monotonic() < deadline
        time.sleep(0.01)
    t0 = time.monotonic()
    srv.should_exit = True
    for c in clients:
        c.join(30)
    assert time.monotonic() - t0 < CANCEL_GRACE_S, "the requests waited for the engine"
    status, body = got[False]
    assert status == 503 and _json.loads(body)["error"]["code"] == "shutting_down", got
    status, body = got[True]
    events = [line for line in body.splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "data: [DONE]", body
    assert "shutting down" in _json.loads(events[-2][6:])["error"]["message"]
    thread.join(30)
    assert not thread.is_alive()


def test_http_client_disconnect_frees_its_blocks_within_a_step():
    """A streaming client hangs up after its first chunk while another keeps decoding: its
    blocks are back in the pool within a step or two (each step 20 ms), long before its 200
    tokens; the other request is untouched."""
    from test_serve import Server, raw, wait_for

    model = FakeModel(n_ctx=256)
    model.lm.delay_s = 0.02
    engine = Engine(model, max_queue=4, max_batch=4, block_size=4).start()
    server = Server(engine, "fake")
    try:
        other = {}
        keep = threading.Thread(target=lambda: other.update(r=server.client.completions.create(
            model="fake", prompt=[3, 4, 5], max_tokens=30, temperature=0)))
        keep.start()
        stream = server.client.completions.create(model="fake", prompt=[11] * 30,
                                                  max_tokens=200, temperature=0, stream=True)
        assert len(reference([11] * 30, 200)) == 52   # its EOS comes 52 steps (1 s) later
        next(iter(stream))
        kv = engine.kv
        assert kv.num_allocated_blocks >= 8
        steps = model.lm.steps
        stream.close()
        assert wait_for(lambda: engine.stats["aborted"] == 1, timeout=2.0)
        assert model.lm.steps - steps <= 10        # noticed within a few steps (20 ms each)
        keep.join(30)
        want = reference([3, 4, 5], 30)
        assert other["r"].choices[0].text == "".join(map(piece, want))
        assert wait_for(lambda: kv.num_free_blocks == kv.num_blocks, timeout=2.0)
        status, health = raw(server.url + "/health")
        assert status == 200 and health["kv_free_blocks"] == health["kv_blocks"] == kv.num_blocks
        assert health["running"] == health["running_seqs"] == health["waiting"] == 0
    finally:
        server.stop()
        engine.shutdown(10)
    assert_no_block_leaked(engine)


def test_ignore_eos_decodes_past_the_end_of_generation_token():
    """`SamplingParams.ignore_eos` (bench/batched.py's equal-length sequences): the sequence
    that stops at EOS after 52 tokens alone goes on to max_tokens, the same tokens first."""
    want = reference([11] * 30, 200)
    assert len(want) == 52 and want[-1] == EOS
    for ignore, count, reason in ((False, 52, "stop"), (True, 60, "length")):
        engine = engine_of(max_batch=2)
        sink = Collect()
        engine.add_request([11] * 30, SamplingParams(max_tokens=60, ignore_eos=ignore), sink)
        run_to_end(engine)
        assert sink.tokens[0][:52] == want and len(sink.tokens[0]) == count
        assert sink.reasons[0] == reason
        assert_no_block_leaked(engine)
