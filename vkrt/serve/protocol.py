"""The OpenAI wire format: request parsing and validation, response and chunk building.

Field names, defaults and shapes follow the OpenAI API reference (Completions: "Create
completion"; Chat: "Create chat completion"; "The chat completion chunk object"; "Error
codes"). A request body is checked field by field before anything is queued: an unknown
field, a value of the wrong type or range, or a field vkrt does not implement given a
non-default value raises `ProtocolError` (HTTP 400) naming the field and the value.
Nothing here touches the model or the event loop.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from vkrt.serve.request import MAX_LOGPROBS, SamplingParams, TokenLogprob

COMPLETION_DEFAULT_MAX_TOKENS = 16   # OpenAI's documented default for /v1/completions
MAX_STOP = 4                         # OpenAI: "Up to 4 sequences"
MAX_N = 16
MAX_PROMPTS = 64                     # prompts in one completions request
MAX_COMPLETION_LOGPROBS = 5          # OpenAI (Completions, `logprobs`): "The maximum value is 5"


class ProtocolError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI's error `type`, the offending
    `param` (a field name, or None) and a machine-readable `code` (or None)."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = (
            message, status, type, param, code)

    def body(self) -> dict:
        """{"error": {"message", "type", "param", "code"}} (OpenAI's error object). Text
        that came from the request and cannot be UTF-8 (a lone surrogate, a name or value
        quoted back) is written with backslash escapes, so the error is always sendable."""
        def text(v: str | None) -> str | None:
            return None if v is None else v.encode("utf-8", "backslashreplace").decode()
        return {"error": {"message": text(self.message), "type": self.type,
                          "param": text(self.param), "code": self.code}}


def _bad(name: str, value: Any, expected: str) -> ProtocolError:
    shown = json.dumps(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ProtocolError(f"'{name}': expected {expected}, got {shown}", param=name)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_utf8(s: str) -> bool:
    """`s` can be UTF-8 (no lone surrogate, which JSON's \\ud800 escapes can carry)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


# Fields OpenAI defines that vkrt accepts only at their neutral value (name -> is-neutral).
_NEUTRAL = {
    "best_of": lambda v: v is None or v == 1,
    "suffix": lambda v: v is None,
    "tools": lambda v: v is None or v == [],
    "tool_choice": lambda v: v is None or v == "none",
    "parallel_tool_calls": lambda v: True,
    "response_format": lambda v: v is None or v == {"type": "text"},
    "user": lambda v: v is None or isinstance(v, str),
    "metadata": lambda v: True,
    "store": lambda v: v is None or v is False,
    "service_tier": lambda v: True,
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
           "stop", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "logit_bias"}
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs", "echo"} | set(_NEUTRAL) - {
    "tools", "tool_choice", "parallel_tool_calls", "response_format", "store", "metadata"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"} | set(
    _NEUTRAL) - {"best_of", "suffix"}


@dataclass
class ParsedRequest:
    """A checked request: `prompt` (completions: a list of prompts, each text or token ids;
    chat: the messages), the model
    name it asked for, `params` (SamplingParams; `max_tokens` None means "the rest of the
    context"), `stream`, `include_usage` (stream_options.include_usage)."""
    kind: str                    # "completion" or "chat"
    model: str | None
    prompt: Any
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    echo: bool = False           # completions: each choice's text starts with its prompt
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def _common(body: dict, allowed: set[str]) -> dict:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    for name in body:
        if name not in allowed:
            raise ProtocolError(f"'{name}': unknown field", param=name)
        if name in _NEUTRAL and not _NEUTRAL[name](body[name]):
            raise ProtocolError(f"'{name}': not supported by vkrt (got "
                                f"{json.dumps(body[name])[:60]})", param=name)
    out: dict = {}
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", model, "a string")
    out["model"] = model
    t = body.get("temperature", 1.0)
    t = 1.0 if t is None else t
    if not (_is_number(t) and 0 <= t <= 2):
        raise _bad("temperature", t, "a number from 0 to 2")
    p = body.get("top_p", 1.0)
    p = 1.0 if p is None else p
    if not (_is_number(p) and 0 < p <= 1):
        raise _bad("top_p", p, "a number in (0, 1]")
    n = body.get("n", 1)
    n = 1 if n is None else n
    if not (_is_int(n) and 1 <= n <= MAX_N):
        raise _bad("n", n, f"an integer from 1 to {MAX_N}")
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and 0 <= seed < 2 ** 63):
        raise _bad("seed", seed, "an integer from 0 to 2**63 - 1")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not (isinstance(stop, list) and len(stop) <= MAX_STOP
            and all(isinstance(s, str) and s and _is_utf8(s) for s in stop)):
        raise _bad("stop", body.get("stop"), f"a non-empty string or a list of up to "
                                             f"{MAX_STOP} non-empty strings")
    stream = body.get("stream", False)
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise _bad("stream", stream, "true or false")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage",
                                                            "continuous_usage_stats"}:
            raise _bad("stream_options", options, 'an object {"include_usage": bool}')
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _bad("stream_options.include_usage", include_usage, "true or false")
        if not stream:
            raise ProtocolError("'stream_options': only allowed when 'stream' is true",
                                param="stream_options")
    penalties = {}
    for name, lo, hi, default in (("presence_penalty", -2, 2, 0.0),
                                  ("frequency_penalty", -2, 2, 0.0),
                                  ("repetition_penalty", 0, math.inf, 1.0)):
        v = body.get(name)
        v = default if v is None else v
        if not (_is_number(v) and lo <= v <= hi and (name != "repetition_penalty" or v > 0)):
            raise _bad(name, v, f"a number from {lo} to {hi}" if hi < math.inf
                       else "a number > 0")
        penalties[name] = float(v)
    bias = body.get("logit_bias")
    bias = {} if bias is None else bias
    if not isinstance(bias, dict):
        raise _bad("logit_bias", bias, "an object mapping token ids to numbers from -100 to 100")
    pairs = []
    for key, v in bias.items():
        # (One spelling per id: "012" would add a second bias to id 12.)
        if not (key.isascii() and key.isdigit() and len(key) <= 12 and key == str(int(key))
                and _is_number(v) and -100 <= v <= 100):
            raise _bad("logit_bias", {key: v},
                       "token ids (as strings of digits) mapped to numbers from -100 to 100")
        pairs.append((int(key), float(v)))
    penalties["logit_bias"] = tuple(pairs)
    out.update(temperature=float(t), top_p=float(p), n=n, seed=seed, stop=tuple(stop),
               stream=stream, include_usage=include_usage, penalties=penalties)
    return out


def _max_tokens(body: dict, name: str, default: int | None) -> int | None:
    v = body.get(name)
    if v is None:
        return default
    if not (_is_int(v) and v >= 1):
        raise _bad(name, v, "an integer >= 1")
    return v


def _params(c: dict, max_tokens: int | None, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=c["temperature"], top_p=c["top_p"],
                          seed=c["seed"], stop=c["stop"], n=c["n"], logprobs=logprobs,
                          **c["penalties"])


def _completion_logprobs(body: dict) -> int | None:
    """Completions' `logprobs`: null, or how many most likely tokens (0 .. 5) to give with
    each generated one's log-probability."""
    v = body.get("logprobs")
    if v is None:
        return None
    if not (_is_int(v) and 0 <= v <= MAX_COMPLETION_LOGPROBS):
        raise _bad("logprobs", v, f"an integer from 0 to {MAX_COMPLETION_LOGPROBS} or null")
    return v


def _chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs` (a boolean) and `top_logprobs` (0 .. 20, only with logprobs true):
    None, or the count of most likely tokens per generated one."""
    on, top = body.get("logprobs"), body.get("top_logprobs")
    if on is not None and not isinstance(on, bool):
        raise _bad("logprobs", on, "true or false")
    if top is not None:
        if not (_is_int(top) and 0 <= top <= MAX_LOGPROBS):
            raise _bad("top_logprobs", top, f"an integer from 0 to {MAX_LOGPROBS} or null")
        if not on:
            raise ProtocolError("'top_logprobs': only allowed when 'logprobs' is true",
                                param="top_logprobs")
    return (top or 0) if on else None


def parse_completion(body: Any) -> ParsedRequest:
    """POST /v1/completions body -> ParsedRequest whose `prompt` is a list of prompts (each
    a string or a list of token ids): `prompt` is one of those or a non-empty list of them
    (at most MAX_PROMPTS; the response has n choices per prompt, prompt k's at indices
    k * n ..). Raises ProtocolError (400) naming the field."""
    c = _common(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")

    def one(p: Any) -> bool:
        return isinstance(p, str) or (isinstance(p, list) and bool(p)
                                      and all(_is_int(i) for i in p))

    if one(prompt):
        prompts = [prompt]
    elif (isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPTS
          and all(isinstance(p, (str, list)) for p in prompt)):
        prompts = prompt
        for k, p in enumerate(prompts):
            if not one(p):
                raise _bad(f"prompt[{k}]", p, "a string or a non-empty list of token ids")
    else:
        raise _bad("prompt", prompt, "a string, a non-empty list of token ids, or a list of "
                                     f"up to {MAX_PROMPTS} of those")
    echo = body.get("echo")
    echo = False if echo is None else echo
    if not isinstance(echo, bool):
        raise _bad("echo", echo, "true or false")
    logprobs = _completion_logprobs(body)
    params = _params(c, _max_tokens(body, "max_tokens", COMPLETION_DEFAULT_MAX_TOKENS), logprobs)
    if echo and logprobs is not None:      # the prompt's tokens get theirs too
        params = dataclasses.replace(params, prompt_logprobs=logprobs)
    return ParsedRequest("completion", c["model"], prompts, params, c["stream"],
                         c["include_usage"], echo)


def parse_chat(body: Any) -> ParsedRequest:
    """POST /v1/chat/completions body -> ParsedRequest with `prompt` the messages as the chat
    template takes them ([{"role", "content": str}]; content given as a list of
    {"type": "text", "text"} parts is joined). `max_completion_tokens` (or the deprecated
    `max_tokens`) defaults to the rest of the context. Raises ProtocolError (400)."""
    c = _common(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages):
        raise _bad("messages", messages, "a non-empty list of messages")
    checked = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(where, m, 'an object with a "role" string and a "content"')
        if m["role"] not in ("system", "developer", "user", "assistant"):
            raise _bad(f"{where}.role", m["role"],
                       "one of system, developer, user, assistant")
        for key in m:
            if key not in ("role", "content", "name"):
                raise ProtocolError(f"'{where}.{key}': unknown or unsupported field",
                                    param=f"{where}.{key}")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"{where}.content", content,
                           'a string or a list of {"type": "text", "text": ...} parts')
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"{where}.content", content, "a string")
        role = "system" if m["role"] == "developer" else m["role"]
        checked.append({"role": role, "content": content})
    if body.get("max_completion_tokens") is not None:
        max_tokens = _max_tokens(body, "max_completion_tokens", None)
    else:
        max_tokens = _max_tokens(body, "max_tokens", None)
    return ParsedRequest("chat", c["model"], checked,
                         _params(c, max_tokens, _chat_logprobs(body)),
                         c["stream"], c["include_usage"])


# -- responses ------------------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens`: the prompt positions
    the prefix cache held (vkrt/serve/kv_cache.py)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _head(req: ParsedRequest, model: str, chunk: bool) -> dict:
    if req.kind == "chat":
        return {"id": f"chatcmpl-{req.id}",
                "object": "chat.completion.chunk" if chunk else "chat.completion",
                "created": req.created, "model": model}
    return {"id": f"cmpl-{req.id}", "object": "text_completion", "created": req.created,
            "model": model}


def logprobs_json(req: ParsedRequest, entries: list[TokenLogprob] | None,
                  text_offset: int = 0) -> dict | None:
    """A choice's `logprobs` for `entries` (None when the request asked for none).
    Completions (the legacy shape): {"tokens", "token_logprobs", "top_logprobs": one
    {text: logprob} per token, the most likely ones and the chosen one ("up to
    logprobs + 1 elements"; ids whose texts are alike, e.g. parts of one UTF-8 character
    that decode to U+FFFD alone, share the entry of the more likely), "text_offset": each
    token's offset in the choice's text from `text_offset` on, by the tokens' own texts}. Chat: {"content": [{"token", "logprob",
    "bytes" (the text's UTF-8), "top_logprobs": [{"token", "logprob", "bytes"}]}],
    "refusal": null}. An entry without a logprob (an echoed prompt's first token) has
    null for it and for its top_logprobs."""
    if req.params.logprobs is None or entries is None:
        return None
    if req.kind == "chat":
        def one(text: str, lp: float) -> dict:
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
        return {"content": [{**one(e.token, e.logprob),
                             "top_logprobs": [one(t, v) for _, t, v in e.top]}
                            for e in entries], "refusal": None}
    offsets, tops = [], []
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.token)
        top: dict[str, float] | None = None
        if e.logprob is not None:
            top = {}
            for _, t, v in e.top:
                top.setdefault(t, v)
            top.setdefault(e.token, e.logprob)
        tops.append(top)
    return {"tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def response(req: ParsedRequest, model: str, texts: list[str], reasons: list[str],
             prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
             logprobs: list[list[TokenLogprob]] | None = None) -> dict:
    """The whole (non-streamed) response: one choice per generated sequence (`texts`: with
    echo, the prompt's text first; `logprobs`: each choice's `TokenLogprob`s, with echo the
    prompt's first, when the request asked for them)."""
    out = _head(req, model, chunk=False)
    lps = [logprobs_json(req, logprobs[i] if logprobs else None) for i in range(len(texts))]
    if req.kind == "chat":
        out["choices"] = [{"index": i, "message": {"role": "assistant", "content": t},
                           "logprobs": lps[i], "finish_reason": r}
                          for i, (t, r) in enumerate(zip(texts, reasons))]
    else:
        out["choices"] = [{"index": i, "text": t, "logprobs": lps[i], "finish_reason": r}
                          for i, (t, r) in enumerate(zip(texts, reasons))]
    out["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
    return out


def chunk(req: ParsedRequest, model: str, index: int, text: str | None,
          finish_reason: str | None = None, role: bool = False,
          logprobs: dict | None = None) -> dict:
    """One streamed chunk for choice `index`: new `text` (for chat, `delta.content`; `role`
    adds `delta.role` = "assistant", as the first chunk of a chat choice carries), the
    `logprobs` of its tokens (`logprobs_json`), and the `finish_reason` on a choice's last
    chunk. With include_usage every chunk has
    `"usage": null` (OpenAI: "All other chunks will also include a usage field, but with a
    null value")."""
    out = _head(req, model, chunk=True)
    if req.kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": finish_reason}
    out["choices"] = [choice]
    if req.include_usage:
        out["usage"] = None
    return out


def usage_chunk(req: ParsedRequest, model: str, prompt_tokens: int,
                completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The last chunk with stream_options.include_usage: empty `choices`, the `usage`."""
    out = _head(req, model, chunk=True)
    out["choices"] = []
    out["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
    return out


def sse(obj: dict | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line (`data: [DONE]` for the
    string "[DONE]")."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()
