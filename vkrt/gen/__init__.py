"""Ahead-of-time shader toolchain: GLSL -> SPIR-V (`compile`), reflection (`reflect`),
`modules.json` and its runtime loader (`metadata`), the `gen-spirv` command (`build`, `cli`).

Only `metadata` is imported at runtime; it needs no compiler."""
