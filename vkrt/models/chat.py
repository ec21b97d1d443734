"""Rendering a model's chat template (`tokenizer.chat_template` in the GGUF) to prompt text.

The template comes from the model file, so it is untrusted code: it runs in jinja2's
`ImmutableSandboxedEnvironment`. llama-cpp-python rendered templates in a plain
`jinja2.Environment`, and a crafted GGUF ran shell commands through `__globals__`
(CVE-2024-34359). The environment options follow transformers' `apply_chat_template`
(trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a `tojson` that keeps non-ASCII),
so a template renders the same here as there.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vkrt.errors import ModelFormatError


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


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Raise at the first unsafe attribute access. jinja2's sandbox only returns an Undefined
    there, which renders as "" and would let a hostile template pass silently."""

    def unsafe_undefined(self, obj: Any, attribute: str):
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True,
                         extensions=[jinja2.ext.loopcontrols])
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
