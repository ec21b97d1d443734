"""Which family reads a model: a GGUF file's `general.architecture`, or the `model_type` of a
Hugging Face checkpoint folder's `config.json`, looked up in `FAMILIES`.

A family is one module under `vkrt/models/` defining `checkpoint_from_gguf(gguf)` and/or
`checkpoint_from_folder(path, config)`, each returning a `Checkpoint`; a family of another
shape joins by adding its module and one line to `FAMILIES`, a Llama-like one by its
description in `vkrt.models.arch.FAMILIES`. The model it builds follows
`vkrt.models.generate.CausalLM`, so the token loop, sampling and the CLI work on it unchanged.
"""
from __future__ import annotations

import importlib
import json
import operator
import os
from dataclasses import dataclass
from typing import Any, Callable

from vkrt.errors import ConfigError, ModelFormatError, VkrtError
from vkrt.models.arch import FAMILIES as LLAMA_LIKE

# architecture / model_type -> the module of the family that implements it: every Llama-like
# architecture vkrt/models/arch.py describes runs in vkrt/models/llama.py.
FAMILIES = {**{name: "vkrt.models.llama" for name in LLAMA_LIKE}, "opt": "vkrt.models.opt"}


@dataclass
class Checkpoint:
    """A model file or folder read and checked, its weights not yet uploaded.

    hparams: the family's hyperparameters (`n_ctx`, the context length in tokens, and
    `n_vocab` at least); tokenizer: a `vkrt.models.tokenizer.Tokenizer`-like object
    (encode, decode, stream, eog_ids, bos_id, eos_id); chat_template: the jinja2 chat template,
    or None; build(device, progress): upload the weights to `device` and return the family's
    model (a `CausalLM`), showing a progress bar when `progress`."""
    path: str
    family: str
    hparams: Any
    tokenizer: Any
    chat_template: str | None
    build: Callable[..., Any]

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        """Token ids for `prompt`: a list of ids is returned as is; text is tokenized raw
        (special-token text such as `<|im_start|>` becomes the special token, so a chat format
        can be written by hand) or, with `chat`, as one user message through the model's chat
        template (message text stays plain text: `vkrt.models.chat.encode_chat`).
        Raises VkrtError when `chat` is given and the model has no chat template, or an id is
        outside the vocabulary; ConfigError for a prompt neither text nor a sequence of
        integers (a float id is not rounded)."""
        if not isinstance(prompt, str):
            try:
                ids = [_token_id(i) for i in prompt]
            except TypeError:
                shown = repr(prompt)
                raise ConfigError("prompt must be text or a sequence of integer token ids, got "
                                  + (shown if len(shown) <= 60 else type(prompt).__name__)
                                  ) from None
            bad = [i for i in ids if not 0 <= i < self.hparams.n_vocab]
            if bad:
                raise VkrtError(f"token id {bad[0]} is outside the model's "
                                f"{self.hparams.n_vocab}-token vocabulary")
            return ids
        tok = self.tokenizer
        if not chat:
            return tok.encode(prompt)
        if not self.chat_template:
            raise VkrtError(f"{self.path}: chat requested but the model has no chat template")
        from vkrt.models.chat import encode_chat

        def text(i: int | None) -> str:
            return "" if i is None else tok.decode([i])

        return encode_chat(tok, self.chat_template, [{"role": "user", "content": prompt}],
                           add_generation_prompt=True, bos_token=text(tok.bos_id),
                           eos_token=text(tok.eos_id))


def _token_id(i) -> int:
    """An int (numpy's integers too) as a token id; TypeError for a bool, float or text."""
    if isinstance(i, bool):
        raise TypeError(i)
    return operator.index(i)


def _family(name: str, where: str, what: str, reader: str):
    """The module of family `name`; ModelFormatError naming `where` and listing the families
    whose module has `reader` (checkpoint_from_gguf or checkpoint_from_folder: those that read
    this format) when there is none."""
    if not isinstance(name, str) or name not in FAMILIES:
        supported = sorted(n for n, module in FAMILIES.items()
                           if hasattr(importlib.import_module(module), reader))
        raise ModelFormatError(f"{where}: unsupported {what} {name!r} "
                               f"(supported: {', '.join(supported)})")
    return importlib.import_module(FAMILIES[name])


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read the model at `path` (a `.gguf` file or a Hugging Face checkpoint folder holding
    `config.json`) and check it, without touching a device.
    Raises ModelFormatError (one line naming the file and the key) for a missing path, a
    folder without `config.json`, an unreadable config, an architecture or model_type no family
    implements, or a format the family does not read; the family's own errors otherwise."""
    path = os.fspath(path)
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        try:
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        except FileNotFoundError:
            raise ModelFormatError(f"{path}: a folder without config.json is not a Hugging "
                                   "Face checkpoint (give a .gguf file or a checkpoint folder)"
                                   ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFormatError(f"{config_path}: cannot read: {e}") from None
        if not isinstance(config, dict):
            raise ModelFormatError(f"{config_path}: expected a JSON object")
        family = _family(config.get("model_type"), config_path, "model_type",
                         "checkpoint_from_folder")
        reader = getattr(family, "checkpoint_from_folder", None)
        if reader is None:
            raise ModelFormatError(f"{path}: vkrt reads {config['model_type']!r} models from "
                                   "GGUF files only")
        return reader(path, config)
    from vkrt.models.gguf import load_gguf

    g = load_gguf(path)
    family = _family(g.architecture, path, "architecture", "checkpoint_from_gguf")
    reader = getattr(family, "checkpoint_from_gguf", None)
    if reader is None:
        raise ModelFormatError(f"{path}: vkrt reads {g.architecture!r} models from Hugging "
                               "Face checkpoint folders only")
    return reader(g)
