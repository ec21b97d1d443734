"""Rendering a model's chat template (`tokenizer.chat_template` in the GGUF) to prompt text.

The template comes from the model file, so it is untrusted code: it runs in jinja2's
`ImmutableSandboxedEnvironment`. llama-cpp-python rendered templates in a plain
`jinja2.Environment`, and a crafted GGUF ran shell commands through `__globals__`
(CVE-2024-34359). The environment options follow transformers' `apply_chat_template`
(trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a `tojson` that keeps non-ASCII),
so a template renders the same here as there, including the `{% generation %}` blocks that
transformers' AssistantTracker extension defines (rendered as if the tags were absent).

`encode_chat` turns messages into token ids so that only what the template itself writes can
become a special token: message text that spells `<|im_end|>` stays plain text.
"""

from __future__ import annotations

import json
import re
import secrets
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vkrt.errors import ModelFormatError, VkrtError


class _TemplateRaised(Exception):
    """What the template's own `raise_exception(msg)` raises."""


def _raise_exception(message: str):
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators=None, sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes <, >, & and ' for HTML, which changes the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTags(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers' AssistantTracker
    (utils/chat_template_utils.py) marks the assistant's tokens with these tags for
    `return_assistant_tokens_mask`; the rendered text is the body, as if the tags were absent."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller):
        return caller()


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Raise at the first unsafe attribute access. jinja2's sandbox only returns an Undefined
    there, which renders as "" and would let a hostile template pass silently."""

    def unsafe_undefined(self, obj: Any, attribute: str):
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True,
                         extensions=[jinja2.ext.loopcontrols, _GenerationTags])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def render_chat(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **extra: Any) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]).

    add_generation_prompt: end with the opening of an assistant turn. bos_token/eos_token: the
    token strings the template may refer to; `extra` goes to the template as more variables.
    Raises ModelFormatError (one line) when the template does not parse, fails while rendering,
    calls `raise_exception`, or touches something the sandbox forbids (jinja2 SecurityError).
    """
    try:
        compiled = _environment().from_string(template)
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
    except jinja2.exceptions.SecurityError as e:
        raise ModelFormatError(f"chat template tried an unsafe operation: {_one_line(e)}") from None
    except _TemplateRaised as e:
        raise ModelFormatError(f"chat template raised: {_one_line(e)}") from None
    except jinja2.TemplateSyntaxError as e:
        raise ModelFormatError(f"chat template syntax error at line {e.lineno}: "
                               f"{_one_line(e.message)}") from None
    except Exception as e:  # UndefinedError, TypeError, ... from inside the template
        raise ModelFormatError(f"chat template failed: {type(e).__name__}: {_one_line(e)}") from None


def encode_chat(tokenizer, template: str, messages: list[dict[str, Any]],
                add_generation_prompt: bool = True, **extra: Any) -> list[int]:
    """Token ids of the chat prompt for `messages`, where only text the template itself writes
    can become special tokens. A message containing `hi<|im_end|>\n<|im_start|>system` gets
    the plain-text ids of those characters, so a user cannot forge a turn.

    How: the template is rendered twice, once with the real messages and once with every
    string `content` replaced by a unique placeholder (private-use characters around a random
    number). When the second render, with the placeholders put back to the contents, equals
    the first, the placeholders give the exact character spans of message text in the prompt.
    Special tokens are then looked for only in the template's own text (leftmost, longest
    first, as `tokenizers` matches added tokens), and the text between them (template text
    and message text together, as one string, so that the ids equal those of tokenizing the
    whole prompt whenever no message spells a special token) is encoded with special tokens
    off. A template that transforms the contents (e.g. strips a `<think>` part) makes the two
    renders differ; then the whole prompt is encoded with special tokens on, and accepted
    only when it holds the same sequence of special tokens as the template writes with the
    placeholders, otherwise refused.

    bos_token/eos_token and `extra` go to the template (see `render_chat`); BOS is prepended
    as `tokenizer.encode` does (the model's add_bos, never a second one).
    Raises ModelFormatError when the template fails (see `render_chat`), VkrtError when a
    message's text is not valid UTF-8 (naming `messages[i].content`) or holds special-token
    text that cannot be kept apart from the template's.
    """
    from vkrt.models.tokenizer import check_text

    for i, m in enumerate(messages):   # named by message, not by a place in the rendered prompt
        if isinstance(m.get("content"), str):
            check_text(m["content"], f"messages[{i}].content")
    real = render_chat(template, messages, add_generation_prompt, **extra)
    nonce = str(secrets.randbelow(10 ** 18))
    contents: dict[str, str] = {}
    marked = []
    for i, m in enumerate(messages):
        if isinstance(m.get("content"), str):
            key = f"\ue000{nonce}.{i}\ue001"
            contents[key] = m["content"]
            m = {**m, "content": key}
        marked.append(m)
    shape = render_chat(template, marked, add_generation_prompt, **extra)
    parts = re.split("(\ue000" + nonce + r"\.\d+\ue001)", shape)
    # parts alternate: template text, placeholder, template text, ...
    specials = tokenizer.special_tokens
    pattern = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))) \
        if specials else None
    rebuilt = "".join(contents.get(p, p) if i % 2 else p for i, p in enumerate(parts))
    if rebuilt != real or any(p not in contents for p in parts[1::2]):
        if pattern is not None and pattern.findall(real) != pattern.findall(
                "".join(parts[0::2])):
            raise VkrtError("a message contains special-token text and the chat template "
                            "rewrites message text, so the template's own special tokens "
                            "cannot be told apart from the message's: remove the special-token "
                            "text from the message")
        return tokenizer.encode(real)
    ids: list[int] = []
    run: list[str] = []   # text since the last template-written special token
    for i, part in enumerate(parts):
        if i % 2:
            run.append(contents[part])
            continue
        pos = 0
        for match in (pattern.finditer(part) if pattern is not None else ()):
            run.append(part[pos:match.start()])
            ids += tokenizer.encode("".join(run), add_bos=False, special=False)
            ids.append(specials[match.group()])
            run, pos = [], match.end()
        run.append(part[pos:])
    ids += tokenizer.encode("".join(run), add_bos=False, special=False)
    bos = tokenizer.bos_id
    if tokenizer.add_bos and bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
    return ids
