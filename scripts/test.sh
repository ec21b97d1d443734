#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), the committed SPIR-V is current, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/gen-spirv --check
exec .venv/bin/python -m pytest "$@"
