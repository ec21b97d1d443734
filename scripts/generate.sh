#!/usr/bin/env bash
# Quickstart: set everything up (idempotent), then let SmolLM2-135M-Instruct write on Vulkan.
# Extra arguments go to `vkrt generate` (default: a chat prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh run
if [ $# -eq 0 ]; then set -- "What is the capital of France?" --chat --max-tokens 48; fi
exec .venv/bin/vkrt generate "$@"
