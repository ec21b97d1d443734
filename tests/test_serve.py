"""`vkrt.serve` through the official `openai` client against a real uvicorn server on
127.0.0.1 (port 0, in a background thread of this process, so a test can pause the engine
or slow its steps), on the tiny random OPT checkpoint; once on the default SmolLM2 model;
`vkrt serve` itself as a subprocess (SIGTERM, one-line errors)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
import uvicorn

import vkrt
from vkrt.serve import Engine, SamplingParams
from vkrt.serve.app import build_app
from vkrt.serve.engine import StopChecker

NAME = "tiny-opt"
PROMPT = "Hello world"
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


class Server:
    """uvicorn serving `build_app(engine, name)` on 127.0.0.1:<free port> in a thread."""

    def __init__(self, engine, name, api_key=None):
        config = uvicorn.Config(build_app(engine, name, api_key=api_key), host="127.0.0.1",
                                port=0,
                                log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "no server"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0,
                                    timeout=60)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)


def raw(url, body=None, method=None):
    """(status, parsed JSON) of a request with `body` (bytes or an object) to `url`."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def chat_folder(opt_folder, tmp_path_factory):
    """The tiny OPT checkpoint with a chat template (tokenizer_config.json)."""
    folder = tmp_path_factory.mktemp("serve") / "opt-chat"
    shutil.copytree(opt_folder, folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    return str(folder)


@pytest.fixture(scope="module")
def served(chat_folder, device):
    """(model, engine, server) on the tiny model, with references computed by
    `model.generate` before the engine thread owns the model."""
    model = vkrt.load(chat_folder, device=device)
    refs = {"greedy": list(model.generate(PROMPT, max_tokens=24)),
            "ids": model.encode(PROMPT)}
    refs["tokens"] = model.generate(PROMPT, max_tokens=24)
    list(refs["tokens"])
    refs["tokens"] = refs["tokens"].result.tokens
    chat_ids = model.checkpoint.encode("Hi there", chat=True)
    refs["chat"] = "".join(model.generate(chat_ids, max_tokens=12))
    refs["chat4"] = "".join(model.generate(chat_ids, max_tokens=4))
    refs["long_ids"] = (refs["ids"] * 40)[:40]          # 2 whole KV blocks of 16, and 8
    refs["long"] = "".join(model.generate(refs["long_ids"], max_tokens=8))
    refs["decode"] = model.tokenizer.decode
    engine = Engine(model, max_queue=2).start()
    server = Server(engine, NAME)
    server.refs = refs
    yield model, engine, server
    server.stop()
    engine.shutdown()
    model.close()


@pytest.fixture
def srv(served):
    model, engine, server = served
    engine.resume()
    yield server
    engine.resume()
    assert wait_for(lambda: engine.load()["running"] == engine.load()["waiting"] == 0)


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def complete(client, **kw):
    kw.setdefault("model", NAME)
    kw.setdefault("prompt", PROMPT)
    kw.setdefault("temperature", 0)
    return client.completions.create(**kw)


def streamed(stream):
    """(texts by choice index, finish reasons by index, chunks) of a completion stream."""
    texts, reasons, chunks = {}, {}, []
    for c in stream:
        chunks.append(c)
        for ch in c.choices:
            piece = ch.text if hasattr(ch, "text") else (ch.delta.content or "")
            texts[ch.index] = texts.get(ch.index, "") + piece
            if ch.finish_reason is not None:
                reasons[ch.index] = ch.finish_reason
    return texts, reasons, chunks


# -- completions --------------------------------------------------------------------------

def test_greedy_completion_equals_generate_streamed_or_not(srv):
    expected = "".join(srv.refs["greedy"])
    r = complete(srv.client, max_tokens=24)
    assert r.choices[0].text == expected and r.object == "text_completion"
    assert r.choices[0].finish_reason == "length" and r.model == NAME
    assert (r.usage.prompt_tokens, r.usage.completion_tokens,
            r.usage.total_tokens) == (len(srv.refs["ids"]), 24, len(srv.refs["ids"]) + 24)
    texts, reasons, chunks = streamed(complete(srv.client, max_tokens=24, stream=True))
    assert texts == {0: expected} and reasons == {0: "length"}
    assert all(c.usage is None for c in chunks)
    # Token ids in, the same text out.
    assert complete(srv.client, prompt=srv.refs["ids"], max_tokens=24).choices[0].text == \
        expected


def test_prefix_cache_hit_reported_in_usage_with_the_same_text(srv):
    """The same 40-token prompt twice: the second takes its first two KV blocks (32
    positions) from the prefix cache, says so in `usage.prompt_tokens_details`, and its
    text is still `generate`'s."""
    ids = srv.refs["long_ids"]
    first = complete(srv.client, prompt=ids, max_tokens=8)
    assert first.choices[0].text == srv.refs["long"]
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    texts, _, chunks = streamed(complete(srv.client, prompt=ids, max_tokens=8, stream=True,
                                         stream_options={"include_usage": True}))
    assert texts == {0: srv.refs["long"]}
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32
    assert chunks[-1].usage.prompt_tokens == 40


def test_several_prompts_in_one_completions_request(srv):
    """`prompt` as a list of prompts (text and token ids), n = 2: n choices per prompt,
    prompt k's at indices 2k, 2k + 1, each the text that prompt gets alone; usage sums the
    prompts; streamed the same; a bad prompt among them is 400 naming it, nothing queued."""
    ids = srv.refs["long_ids"][:12]
    alone = [complete(srv.client, prompt=p, max_tokens=4).choices[0].text
             for p in (PROMPT, ids)]
    r = complete(srv.client, prompt=[PROMPT, ids], max_tokens=4, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [alone[0]] * 2 + [alone[1]] * 2
    assert r.usage.prompt_tokens == len(srv.refs["ids"]) + 12
    assert r.usage.completion_tokens == 4 * 4
    texts, reasons, chunks = streamed(complete(srv.client, prompt=[PROMPT, ids], max_tokens=4,
                                               n=2, stream=True,
                                               stream_options={"include_usage": True}))
    assert texts == {0: alone[0], 1: alone[0], 2: alone[1], 3: alone[1]}
    assert reasons == {i: "length" for i in range(4)}
    assert chunks[-1].usage.completion_tokens == 16
    status, err = raw(srv.url + "/v1/completions", {"prompt": [PROMPT, []]})
    assert status == 400 and err["error"]["param"] == "prompt[1]", err
    status, err = raw(srv.url + "/v1/completions", {"prompt": [PROMPT, ids * 200]})
    assert status == 400 and "'prompt[1]': the prompt is 2400 tokens" in err["error"]["message"]


def test_include_usage_sends_a_last_usage_chunk(srv):
    texts, _, chunks = streamed(complete(srv.client, max_tokens=5, stream=True,
                                         stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        len(srv.refs["ids"]), 5)
    assert all(c.usage is None for c in chunks[:-1])


def stop_spanning_tokens(model_pieces):
    """A stop string made of the last character of one token's text and the first of the
    next, occurring first there and inside no single token's text; the text before it."""
    text = "".join(model_pieces)
    pos = 0
    for a, b in zip(model_pieces, model_pieces[1:]):
        pos += len(a)
        if a and b:
            stop = a[-1] + b[0]
            if text.find(stop) == pos - 1 and not any(stop in p for p in model_pieces):
                return stop, text[:pos - 1]
    pytest.fail(f"no stop string spans two tokens of {model_pieces!r}")


def test_stop_string_across_token_boundary(srv):
    stop, before = stop_spanning_tokens(srv.refs["greedy"])
    r = complete(srv.client, max_tokens=24, stop=stop)
    assert r.choices[0].text == before and r.choices[0].finish_reason == "stop"
    texts, reasons, _ = streamed(complete(srv.client, max_tokens=24, stop=[stop, "\x00zz"],
                                          stream=True))
    assert texts == {0: before} and reasons == {0: "stop"}


def test_stop_checker_holds_back_a_possible_start():
    c = StopChecker(("abc",))
    assert c.add("xa") == ("", False)        # the last len("abc") - 1 characters are held
    assert c.add("b") == ("x", False)
    assert c.add("cd") == ("", True)         # the stop string and what follows are cut
    c = StopChecker(("abc",))
    assert c.add("xab") == ("x", False) and c.add("z", final=True) == ("abz", False)


@pytest.mark.parametrize("kw,word", [({"top_p": 0}, "top_p must"), ({"seed": -1}, "seed"),
                                     ({"temperature": float("nan")}, "temperature"),
                                     ({"stop": [""]}, "stop"), ({"max_tokens": 0}, "max_tokens"),
                                     ({"n": 0}, "n must")])
def test_sampling_params_refuse_bad_values(kw, word):
    from vkrt.errors import ConfigError

    with pytest.raises(ConfigError, match=word):
        SamplingParams(**kw)


def test_n_and_seed_reproducible(srv):
    kw = dict(max_tokens=8, temperature=1.0, seed=7, n=2)
    a, b = complete(srv.client, **kw), complete(srv.client, **kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1]
    assert 2 <= a.usage.completion_tokens <= 16     # over both choices
    other = complete(srv.client, max_tokens=8, temperature=1.0, seed=8, n=2)
    assert [c.text for c in other.choices] != [c.text for c in a.choices]
    texts, reasons, _ = streamed(complete(srv.client, stream=True, **kw))
    assert texts == {i: c.text for i, c in enumerate(a.choices)} and set(reasons) == {0, 1}


# -- chat ---------------------------------------------------------------------------------

def test_chat_streamed_and_not(srv):
    msgs = [{"role": "user", "content": "Hi there"}]
    r = srv.client.chat.completions.create(model=NAME, messages=msgs, temperature=0,
                                           max_tokens=12)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == srv.refs["chat"]
    stream = srv.client.chat.completions.create(model=NAME, messages=msgs, temperature=0,
                                                max_completion_tokens=12, stream=True,
                                                stream_options={"include_usage": True})
    texts, reasons, chunks = streamed(stream)
    assert texts == {0: srv.refs["chat"]} and reasons == {0: r.choices[0].finish_reason}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


# -- models, health, errors ---------------------------------------------------------------

def test_models_and_health(srv):
    assert [m.id for m in srv.client.models.list().data] == [NAME]
    status, body = raw(srv.url + "/health")
    assert status == 200 and body["status"] == "ok"


@pytest.mark.parametrize("field,value", [("temperature", "hot"), ("top_p", 0), ("n", 0),
                                         ("max_tokens", -1), ("stop", 3), ("seed", -2),
                                         ("logprobs", 6), ("logprobs", "3"), ("bogus", 1),
                                         ("top_logprobs", 2), ("prompt", [99999]),
                                         ("stream", "yes"), ("model", 3)])
def test_bad_field_is_400_naming_it(srv, field, value):
    body = {"model": NAME, "prompt": PROMPT, field: value}
    status, err = raw(srv.url + "/v1/completions", body)
    assert status == 400 and err["error"]["param"] == field, err
    assert field in err["error"]["message"] and set(err["error"]) == {
        "message", "type", "param", "code"}


@pytest.mark.parametrize("fields,param", [({"logprobs": "yes"}, "logprobs"),
                                          ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                                          ({"top_logprobs": 2}, "top_logprobs"),
                                          ({"logprobs": False, "top_logprobs": 1}, "top_logprobs"),
                                          ({"echo": True}, "echo")])
def test_bad_chat_logprobs_are_400_naming_the_field(srv, fields, param):
    body = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], **fields}
    status, err = raw(srv.url + "/v1/chat/completions", body)
    assert status == 400 and err["error"]["param"] == param, err


def test_logprobs_equal_transformers_log_softmax_streamed_or_not(srv, chat_folder):
    """Completions with `logprobs` 3: each generated token's log-probability and the 3 most
    likely at its position equal log_softmax of transformers' OPT logits (teacher-forced,
    float64) within 1e-3, the logits' tolerance (tests/test_opt.py); the chosen (greedy)
    token is the most likely; streamed chunks carry the same values with running
    text_offsets. Chat's `logprobs` + `top_logprobs` 2: one entry per token, its UTF-8
    bytes, 2 alternatives each."""
    import torch
    from transformers import AutoModelForCausalLM

    ids, n = srv.refs["ids"], 6
    r = complete(srv.client, prompt=ids, max_tokens=n, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    model = AutoModelForCausalLM.from_pretrained(chat_folder, dtype=torch.float32).eval()
    full = ids + srv.refs["tokens"][:n]
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0].double()
    want = torch.log_softmax(logits, -1).numpy()[len(ids) - 1:len(full) - 1]
    for t, (tok, got, top) in enumerate(zip(srv.refs["tokens"][:n], lp.token_logprobs,
                                            lp.top_logprobs)):
        assert abs(got - want[t, tok]) < 1e-3, (t, got, want[t, tok])
        # The legacy format keys by text: ids that decode alike (parts of one UTF-8
        # character, U+FFFD) share one entry.
        assert 1 <= len(top) <= 3 and max(top.values()) == got               # greedy
        best = np.sort(want[t])[::-1][:3]
        assert all(np.abs(best - v).min() < 1e-3 for v in top.values())
    assert lp.text_offset == list(np.cumsum([0] + [len(s) for s in lp.tokens[:-1]]))
    _, _, chunks = streamed(complete(srv.client, prompt=ids, max_tokens=n, logprobs=3,
                                     stream=True))
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [v for p in parts for v in p.token_logprobs] == lp.token_logprobs
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    c = srv.client.chat.completions.create(model=NAME, temperature=0, max_tokens=4,
                                           logprobs=True, top_logprobs=2,
                                           messages=[{"role": "user", "content": "Hi"}])
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens == 4
    for e in content:
        assert e.bytes == list(e.token.encode()) and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob == e.logprob >= e.top_logprobs[1].logprob
    plain = srv.client.chat.completions.create(model=NAME, temperature=0, max_tokens=4,
                                               messages=[{"role": "user", "content": "Hi"}])
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == c.choices[0].message.content


def test_penalties_equal_transformers_greedy_with_them(srv, served, chat_folder):
    """Greedy with presence, frequency and repetition penalties: the tokens of a loop over
    transformers' OPT logits with the penalties written out here (repetition over prompt and
    output: positive logits divided, negative multiplied; then logit -= frequency * count +
    presence * (count > 0) over the output), through HTTP and the Python engine."""
    import torch
    from transformers import AutoModelForCausalLM

    ids, n = srv.refs["ids"], 8
    pres, freq, rep = 0.5, 1.5, 1.3
    model = AutoModelForCausalLM.from_pretrained(chat_folder, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for _ in range(n):
            x = model(torch.tensor([ids + out])).logits[0, -1].clone()
            seen = sorted(set(ids + out))
            x[seen] = torch.where(x[seen] > 0, x[seen] / rep, x[seen] * rep)
            for t in set(out):
                x[t] -= freq * out.count(t) + pres
            out.append(int(x.argmax()))
    assert out != srv.refs["tokens"][:n]           # the penalties change the greedy tokens
    _, engine, _ = served
    got = [t for o in engine.generate(ids, SamplingParams(
        max_tokens=n, presence_penalty=pres, frequency_penalty=freq, repetition_penalty=rep,
        ignore_eos=True)) for t in o.token_ids]
    assert got == out
    r = complete(srv.client, prompt=ids, max_tokens=n, presence_penalty=pres,
                 frequency_penalty=freq, extra_body={"repetition_penalty": rep})
    assert r.choices[0].text == engine.model.tokenizer.decode(out, continuation=True)
    # logit_bias: +100 on one id makes it every token, greedy or drawn.
    tok = srv.refs["tokens"][0] + 1
    for t in (0, 1):
        r = complete(srv.client, prompt=ids, max_tokens=3, temperature=t,
                     logit_bias={str(tok): 100})
        assert r.choices[0].text == engine.model.tokenizer.decode([tok] * 3, continuation=True)


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.5), ("frequency_penalty", "1"),
                                         ("repetition_penalty", 0), ("repetition_penalty", -1),
                                         ("logit_bias", {"x": 1}), ("logit_bias", {"5": 101}),
                                         ("logit_bias", {"²": 1}), ("logit_bias", [5]),
                                         ("logit_bias", {"99999999": 1}),
                                         ("logit_bias", {"9" * 5000: 1}),
                                         ("logit_bias", {"12": 1, "012": 1}),
                                         ("logit_bias", []), ("logit_bias", 0),
                                         ("echo", 0), ("echo", [])])
def test_bad_penalty_is_400_naming_it(srv, field, value):
    status, err = raw(srv.url + "/v1/completions", {"prompt": "Hi", field: value})
    assert status == 400 and err["error"]["param"] == field, err


def test_echo_with_prompt_logprobs_as_evaluation_harnesses_ask(srv, chat_folder):
    """`echo` with `logprobs` and `max_tokens` 1, several prompts in one request (how
    lm-evaluation-harness scores a continuation through /v1/completions): each choice's
    text is its prompt then the completion; its logprobs cover the prompt's tokens (the
    first null) then the generated one, each within 1e-3 of log_softmax of transformers' OPT
    logits at the position before; the same streamed; a prompt the prefix cache holds is
    computed again (cached_tokens 0); without logprobs echo only prefixes the text."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chat_folder, dtype=torch.float32).eval()
    prompts = [srv.refs["long_ids"][:20], srv.refs["ids"]]
    r = complete(srv.client, prompt=prompts, max_tokens=1, logprobs=1, echo=True)
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    decode = srv.refs["decode"]
    for ids, c in zip(prompts, r.choices):
        lp = c.logprobs
        assert c.text.startswith(decode(ids)) and len(lp.tokens) == len(ids) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        want = torch.log_softmax(logits, -1).numpy()
        for q in range(1, len(ids)):
            assert abs(lp.token_logprobs[q] - want[q - 1, ids[q]]) < 1e-3, q
            assert abs(max(lp.top_logprobs[q].values()) - want[q - 1].max()) < 1e-3
        assert abs(lp.token_logprobs[-1] - want[-1].max()) < 1e-3      # greedy: the argmax
        assert lp.text_offset == list(np.cumsum([0] + [len(s) for s in lp.tokens[:-1]]))
    _, _, chunks = streamed(complete(srv.client, prompt=prompts, max_tokens=1, logprobs=1,
                                     echo=True, stream=True))
    for i, c in enumerate(r.choices):
        parts = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == i]
        assert "".join(p.text for p in parts) == c.text
        got = [v for p in parts if p.logprobs for v in p.logprobs.token_logprobs]
        assert got == c.logprobs.token_logprobs
    plain = complete(srv.client, prompt=PROMPT, max_tokens=3, echo=True)
    assert plain.choices[0].text == PROMPT + "".join(srv.refs["greedy"][:3])
    assert plain.choices[0].logprobs is None


def test_errors_keep_the_server_serving(srv):
    with pytest.raises(openai.BadRequestError) as e:
        srv.client.chat.completions.create(model=NAME, messages=[{"role": "wizard",
                                                                  "content": "x"}])
    assert "role" in str(e.value)
    with pytest.raises(openai.NotFoundError) as e:
        complete(srv.client, model="gpt-9")
    assert e.value.body["code"] == "model_not_found"
    assert raw(srv.url + "/v1/completions", b"{not json")[0] == 400
    status, err = raw(srv.url + "/v1/completions", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested too deeply" in err["error"]["message"]
    # A lone surrogate (JSON "\ud800"): 400 naming the field, not a 500.
    status, err = raw(srv.url + "/v1/completions", b'{"prompt": "a\\ud800", "max_tokens": 2}')
    assert status == 400 and err["error"]["param"] == "prompt", err
    status, err = raw(srv.url + "/v1/chat/completions",
                      b'{"messages": [{"role": "user", "content": "a\\ud800"}]}')
    assert status == 400 and "messages[0].content" in err["error"]["message"], err
    # ... wherever it is: quoted back in the error (escaped), or where no text goes.
    for path, body, status, param in (
            ("/v1/completions", b'{"model": "\\ud800", "prompt": "a"}', 404, "model"),
            ("/v1/completions", b'{"\\ud800": 1, "prompt": "a"}', 400, "\\ud800"),
            ("/v1/completions", b'{"prompt": "a", "stop": "\\ud800"}', 400, "stop"),
            ("/v1/chat/completions",
             b'{"messages": [{"role": "user", "content": "a", "\\ud800": 1}]}', 400,
             "messages[0].\\ud800")):
        got, err = raw(srv.url + path, body)
        assert got == status and err["error"]["param"] == param, (body, err)
    # A number of more than Python's 4,300 digits: 400, without Python's own advice.
    got, err = raw(srv.url + "/v1/completions", b'{"prompt": "a", "seed": ' + b"9" * 5000 + b"}")
    assert got == 400 and "sys." not in err["error"]["message"], err
    assert raw(srv.url + "/v1/nothing")[0] == 404
    got, err = raw(srv.url + "/v1/completions/", {"prompt": "a"})    # no slash redirect
    assert got == 404 and err["error"]["type"] == "not_found_error", err
    with pytest.raises(openai.BadRequestError):   # past the 64-token context
        complete(srv.client, max_tokens=60)
    assert complete(srv.client, max_tokens=3).usage.completion_tokens == 3


def test_prompt_past_context_is_400_before_any_event(srv):
    long = srv.refs["ids"] * 10
    req = urllib.request.Request(srv.url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": NAME, "prompt": long,
                                                  "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and e.value.headers["content-type"] == "application/json"
    err = json.loads(e.value.read())["error"]
    assert err["param"] == "prompt" and "context" in err["message"]


def test_queue_full_is_429(srv, served):
    _, engine, _ = served
    engine.pause()
    results = {}
    waiting = threading.Thread(target=lambda: results.update(
        r=complete(srv.client, max_tokens=2)))
    waiting.start()
    assert wait_for(lambda: engine.load()["waiting"] == 1)   # --max-queue 2: one left
    with pytest.raises(openai.RateLimitError) as e:   # at once, not after waiting
        complete(srv.client.with_options(timeout=5), max_tokens=2,
                 prompt=[PROMPT, PROMPT])         # two prompts take two places
    assert e.value.status_code == 429 and e.value.body["code"] == "queue_full"
    assert "no room for 2 more" in e.value.body["message"]   # checked before queueing any
    assert engine.load()["waiting"] == 1          # all or none of a request's prompts
    with pytest.raises(openai.BadRequestError) as e:      # never: more than the queue holds
        complete(srv.client, max_tokens=2, prompt=[PROMPT] * 3)
    assert e.value.body["param"] == "prompt" and "--max-queue 2" in e.value.body["message"]
    engine.resume()
    waiting.join(30)
    assert results["r"].usage.completion_tokens == 2


def test_engine_not_running_is_503(served):
    model, _, _ = served
    cache = model.lm._paged.buffer
    stopped = Engine(model)            # never started: refuses requests, touches nothing
    assert model.lm._paged.buffer is cache     # the running engine's KV cache kept
    server = Server(stopped, NAME)
    try:
        with pytest.raises(openai.InternalServerError) as e:
            complete(server.client, max_tokens=2)
        assert e.value.status_code == 503 and e.value.body["code"] == "shutting_down"
    finally:
        server.stop()


def test_client_disconnect_frees_the_slot(srv, served):
    _, engine, _ = served
    step = engine.step

    def slow_step():
        time.sleep(0.05)
        return step()

    engine.step = slow_step      # the loop calls self.step: 60 tokens take 3 s
    aborted = engine.stats["aborted"]
    try:
        stream = complete(srv.client, prompt=srv.refs["ids"][:2], max_tokens=60, stream=True)
        next(iter(stream))
        # The engine thread is busy (a step is a GPU wait); the event loop still answers.
        t0 = time.monotonic()
        status, health = raw(srv.url + "/health")
        assert status == 200 and health["running"] == 1 and time.monotonic() - t0 < 1.0
        stream.close()
        assert wait_for(lambda: engine.stats["aborted"] == aborted + 1, timeout=2.0)
        assert engine.load()["running"] == 0
    finally:
        del engine.step
    assert complete(srv.client, max_tokens=2).usage.completion_tokens == 2


def test_client_gone_from_a_non_streamed_request_frees_the_slot(srv, served):
    _, engine, _ = served
    step = engine.step
    engine.step = lambda: (time.sleep(0.05), step())[1]
    aborted = engine.stats["aborted"]
    try:
        with pytest.raises(openai.APITimeoutError):
            complete(srv.client.with_options(timeout=0.3), prompt=srv.refs["ids"][:2],
                     max_tokens=60)
        # Noticed at the next disconnect poll (app.DISCONNECT_POLL_S), long before 60 tokens.
        assert wait_for(lambda: engine.stats["aborted"] == aborted + 1, timeout=2.5)
    finally:
        del engine.step


# -- the engine from Python ----------------------------------------------------------------

def test_engine_from_python(srv, served):
    _, engine, _ = served
    outs = list(engine.generate(PROMPT, SamplingParams(max_tokens=24)))
    assert "".join(o.delta for o in outs) == "".join(srv.refs["greedy"])
    assert [t for o in outs for t in o.token_ids] == srv.refs["tokens"]
    assert outs[-1].request_finished and outs[-1].finish_reason == "length"
    assert outs[-1].ttft_s > 0 and outs[-1].tpot_s > 0
    # Closing the iterator early aborts the request (what `vkrt chat` does at Ctrl-C).
    aborted = engine.stats["aborted"]
    outputs = engine.generate(PROMPT, SamplingParams(max_tokens=40))
    next(outputs)
    outputs.close()
    assert wait_for(lambda: engine.stats["aborted"] == aborted + 1)


def test_api_key_required_on_v1_routes_not_health(served):
    """With an API key, each /v1 route answers 401 (OpenAI's `invalid_api_key`, before the
    body is read) to a request without `Authorization: Bearer <key>` or with another key,
    and serves one with it; /health stays open."""
    _, engine, _ = served
    server = Server(engine, NAME, api_key="s3cret")
    server.refs = served[2].refs
    try:
        base = server.url + "/v1"
        for path, body in (("/completions", {"prompt": PROMPT, "max_tokens": 1}),
                           ("/chat/completions",
                            {"messages": [{"role": "user", "content": "Hi"}]}),
                           ("/models", None)):
            status, err = raw(base + path, body)
            assert status == 401 and err["error"]["code"] == "invalid_api_key", (path, err)
        status, _ = raw(base + "/completions", b"not json")      # refused before parsing
        assert status == 401
        basic = urllib.request.Request(base + "/models",
                                       headers={"Authorization": "Basic s3cret"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(basic, timeout=30)
        assert e.value.code == 401
        wrong = openai.OpenAI(base_url=base, api_key="s3cre", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0, timeout=60)
        assert [m.id for m in right.models.list()] == [NAME]
        r = right.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0)
        assert r.choices[0].text == "".join(server.refs["greedy"][:3])
        assert raw(server.url + "/health")[0] == 200
    finally:
        server.stop()


# -- the default model, once ---------------------------------------------------------------

def test_default_model_greedy_equals_generate(default_model_path, device):
    """SmolLM2 through the server: token-exact with `model.generate` (text and count); its
    chat template through `Engine.encode_chat` as `vkrt generate --chat` encodes it."""
    with vkrt.load(default_model_path, device=device) as model:
        prompt = "1, 2, 3, 4, 5,"
        text = model.generate(prompt, max_tokens=4)
        expected = "".join(text)
        n_tokens = len(text.result.tokens)
        chat_ids = model.checkpoint.encode("Say hi.", chat=True)
        with Engine(model) as engine:
            assert engine.encode_chat([{"role": "user", "content": "Say hi."}]) == chat_ids
            server = Server(engine, "smollm2")
            try:
                texts, reasons, chunks = streamed(server.client.completions.create(
                    model="smollm2", prompt=prompt, max_tokens=4, temperature=0, stream=True,
                    stream_options={"include_usage": True}))
                assert texts == {0: expected} and reasons == {0: "length"}
                assert chunks[-1].usage.completion_tokens == n_tokens == 4
            finally:
                server.stop()


# -- `vkrt serve` as a user runs it ---------------------------------------------------------

def serve_cli(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "vkrt.cli", "serve", *args],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=None if env is None else {**os.environ, **env})


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serves_and_stops_on_a_signal(chat_folder, sig):
    # and --sync-scheduling --no-prefix-caching, named on the startup line
    sync = sig == signal.SIGINT
    # and without them an API key from VKRT_API_KEY
    p = serve_cli("--model", chat_folder, "--port", "0", "--max-queue", "1",
                  *(["--sync-scheduling", "--no-prefix-caching"] if sync else []),
                  env=None if sync else {"VKRT_API_KEY": "k3y"})
    try:
        line = p.stderr.readline()
        assert line.startswith("vkrt: serving opt-chat "), line + p.stderr.read()
        assert f" {'synchronous' if sync else 'asynchronous'} scheduling, " in line, line
        assert f" prefix caching {'off' if sync else 'on'}, " in line, line
        assert (", API key required)" in line) != sync, line
        url = line.split(" on ")[-1].strip()
        client = openai.OpenAI(base_url=url, api_key="none" if sync else "k3y", max_retries=0,
                               timeout=60)
        assert raw(url + "/models")[0] == (200 if sync else 401)
        for cached in (0, 0 if sync else 16):     # a prompt of 2 KV blocks of 16, twice
            r = client.completions.create(model="opt-chat", prompt=list(range(4, 36)),
                                          max_tokens=3, temperature=0)
            assert r.usage.completion_tokens == 3
            assert r.usage.prompt_tokens_details.cached_tokens == cached
        p.send_signal(sig)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert err.splitlines()[-1] == f"vkrt: stopped on {sig.name}" and "Traceback" not in err


def test_cli_sigterm_cancels_a_running_stream_and_exits_0(chat_folder):
    p = serve_cli("--model", chat_folder, "--port", "0", "--shutdown-timeout", "0")
    try:
        url = p.stderr.readline().split(" on ")[-1].strip()
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        stream = client.completions.create(model="opt-chat", prompt=PROMPT, max_tokens=50,
                                           n=16, temperature=1.0, seed=0, stream=True)
        reasons = []
        with pytest.raises(openai.APIError):     # the stream ends with an error event ...
            for c in stream:
                if not reasons:
                    p.send_signal(signal.SIGTERM)
                reasons += [ch.finish_reason for ch in c.choices if ch.finish_reason]
                reasons.append(None)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert len([r for r in reasons if r]) < 16        # ... long before its 16 choices end
    assert p.returncode == 0 and err.splitlines()[-1] == "vkrt: stopped on SIGTERM", err
    # The engine cancelled the stream before uvicorn had to cancel its task.
    assert "Traceback" not in err and "ERROR" not in err, err


@pytest.mark.parametrize("flags,words,code", [
    (["--port", "70000"], ["--port", "70000", "(see vkrt serve --help)"], 2),
    (["--shutdown-timeout", "-1"], ["--shutdown-timeout must be >= 0 seconds, got -1.0"], 2),
    (["--model", "/nonexistent/model.gguf"], ["/nonexistent/model.gguf"], 1),
    (["--host", "256.1.1.1"], ["256.1.1.1"], 1),
    (["--api-key", " "], ["--api-key", "VKRT_API_KEY", "printable ASCII"], 2),
    (["--api-key", " k "], ["--api-key", "without spaces around it"], 2),
    (["--api-key", "sékret"], ["--api-key", "printable ASCII"], 2),
    (["--max-batch", "4", "--max-batched-tokens", "2"], ["--max-batched-tokens", "(4)",
                                                         "(see vkrt serve --help)"], 2),
    # --max-batch left out: the engine checks the family's own (after the load)
    (["--max-batched-tokens", "2"], ["--max-batched-tokens must be at least --max-batch"], 1),
    (["--kv-blocks", "100000000"], ["100000000 blocks of 16 token slots, f32",
                                    "cannot be allocated: 100000000 blocks",
                                    "maxStorageBufferRange", "of this device's memory",
                                    "(--kv-blocks)"], 1),
    (["--kv-blocks", "1000000000000"], ["cannot be allocated: 1000000000000 blocks"], 1),
])
def test_cli_bad_options_are_one_line(chat_folder, flags, words, code):
    """One line each; a flag's value out of its range exits 2 (a usage error), a model,
    address or memory that does not serve exits 1."""
    p = subprocess.run([sys.executable, "-m", "vkrt.cli", "serve", "--model", chat_folder,
                        "--port", "0", *flags], capture_output=True, text=True, timeout=60)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == code and len(lines) == 1, p.stderr
    assert lines[0].startswith("vkrt: error: ") and all(w in lines[0] for w in words)


def test_cli_api_key_from_the_environment_is_a_configuration_error(chat_folder):
    """VKRT_API_KEY that no header can carry: the same one line as --api-key's, but exit 1
    (the environment, not the command line, is wrong)."""
    p = subprocess.run([sys.executable, "-m", "vkrt.cli", "serve", "--model", chat_folder,
                        "--port", "0"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, VKRT_API_KEY="sékret"))
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "VKRT_API_KEY" in lines[0] and "--help" not in lines[0], lines[0]


def _sigint_default():
    """In the child: SIGINT back to its default. A shell running this suite in the background
    (`cmd &` without job control, as CI may) starts it ignored, and Python then installs no
    KeyboardInterrupt handler (as tests/test_cli.py's Ctrl-C test does)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_cli_chat_keeps_the_history_and_survives_ctrl_c(chat_folder, served):
    """Lines piped in: the first reply is the greedy one for that one message; /clear
    forgets; Ctrl-C at the prompt does not end the program; /bye does."""
    reply = served[2].refs["chat4"]
    p = subprocess.Popen([sys.executable, "-m", "vkrt.cli", "chat", "--model", chat_folder,
                          "--max-tokens", "4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, encoding="utf-8",
                         env=dict(os.environ, PYTHONIOENCODING="utf-8"),
                         preexec_fn=_sigint_default)
    try:
        p.stdin.write("Hi there\n")
        p.stdin.flush()
        assert p.stdout.read(len(reply) + 1) == reply + "\n"
        p.send_signal(signal.SIGINT)      # waiting at the prompt
        time.sleep(0.5)
        out, err = p.communicate("Hi there\n/clear\nHi there\n/bye\n", timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert "Ctrl-D or /bye" in err and "Traceback" not in err
    assert out.endswith("\n" + reply + "\n")             # after /clear: the first reply
    assert not out.startswith(reply + "\n")              # with the history: another
    assert "context" not in err


def test_cli_chat_ctrl_c_stops_a_reply_not_the_program(default_model_path):
    """SmolLM2 writes slowly enough on lavapipe to be interrupted mid-reply."""
    p = subprocess.Popen([sys.executable, "-m", "vkrt.cli", "chat", "--model",
                          default_model_path, "--max-tokens", "300"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         encoding="utf-8", env=dict(os.environ, PYTHONIOENCODING="utf-8"),
                         preexec_fn=_sigint_default)
    try:
        p.stdin.write("Count from 1 to 200, one number a line.\n")
        p.stdin.flush()
        first = p.stdout.read(1)       # the reply has started
        p.send_signal(signal.SIGINT)
        out, err = p.communicate("/bye\n", timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert first and (first + out).rstrip("\n").endswith(" [stopped]"), first + out
    assert "Traceback" not in err


@pytest.mark.parametrize("which,flags,words,code", [
    ("chat", ["--top-p", "0"], ["--top-p", "0", "(see vkrt chat --help)"], 2),
    ("chat", ["--max-tokens", "0"], ["--max-tokens must be at least 1, got 0"], 2),
    ("plain", [], ["no chat template"], 1),
])
def test_cli_chat_refusals_are_one_line(chat_folder, opt_folder, which, flags, words, code):
    model = chat_folder if which == "chat" else opt_folder
    p = subprocess.run([sys.executable, "-m", "vkrt.cli", "chat", "--model", model, *flags],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == code and len(lines) == 1, p.stderr
    assert lines[0].startswith("vkrt: error: ") and all(w in lines[0] for w in words)
