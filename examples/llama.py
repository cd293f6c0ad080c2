"""Generate with a Llama, Mistral or Qwen2 checkpoint laid out over a mesh of CPU devices.

    python llama.py --model DIR --mesh dp=1,tp=2 --prompt "Once upon a time" --max-new-tokens 32

DIR is an HF model directory (config.json and model.safetensors, or a sharded index), whose
config.json's architecture picks the class (AutoModelForCausalLM). Without
--model, a random-weight checkpoint of llama2.c's "15M" shape (dim 288, 6 layers, 6 heads, hidden
768, vocab 32000) is written once to ~/.cache/dtorch/llama-15m-random and used: the tokens are
noise, the speed is real. When DIR has a tokenizer (tokenizer.json) and the text extra is installed
(pip install "dtorch[text]": tokenizers, jinja2), the prompt is encoded by it (--chat: through the
model's chat template) and the new tokens print as text while they come; otherwise the prompt's
UTF-8 bytes become ids 3 + byte (Llama's byte-fallback tokens) and the new tokens print as ids.
"""
import argparse
import contextlib
import os
import sys
import time

import numpy as np

import dtorch
from dtorch.models import AutoModelForCausalLM, AutoTokenizer, IncrementalDetokenizer, LlamaConfig, LlamaForCausalLM

TINY_15M = dict(vocab_size=32000, hidden_size=288, intermediate_size=768, num_hidden_layers=6, num_attention_heads=6,
                num_key_value_heads=6, max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def random_checkpoint():
    """The 15M-shape checkpoint with random weights, written on first use."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "dtorch", "llama-15m-random")
    if not os.path.exists(os.path.join(directory, "model.safetensors")):
        print(f"writing a random-weight 15M checkpoint to {directory}")
        dtorch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**TINY_15M)).save_pretrained(directory)
    return directory


def parse_mesh(text):
    """"dp=1,tp=2" -> a cpu mesh with those dim names and sizes."""
    names, sizes = [], []
    for part in text.split(","):
        name, _, size = part.partition("=")
        if not size.isdigit() or int(size) < 1:
            raise SystemExit(f"--mesh: expected name=size pairs such as dp=1,tp=2, got {text!r}")
        names.append(name.strip())
        sizes.append(int(size))
    return dtorch.init_device_mesh("cpu", tuple(sizes), mesh_dim_names=names)


class Tokens:
    """Text <-> ids: the directory's tokenizer (dtorch.models.AutoTokenizer) when it has one and the
    text extra is installed; else ids only."""

    def __init__(self, directory, config):
        self.tokenizer = None
        if os.path.exists(os.path.join(directory, "tokenizer.json")):
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(directory)
            except ImportError:
                print('the checkpoint has a tokenizer but the text extra is not installed (pip install "dtorch[text]"): '
                      "ids only")
        self.bos, self.vocab = config.bos_token_id, config.vocab_size

    def encode(self, text, chat=False):
        head = [] if self.bos is None else [self.bos]   # Qwen2's configs name no BOS
        if self.tokenizer is None:
            return head + [(3 + b) % self.vocab for b in text.encode("utf-8")]
        if chat:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return self.tokenizer.encode(text)

    def decode(self, ids):
        """The text of ``ids`` by the checkpoint's tokenizer (special tokens left out); None without one."""
        return None if self.tokenizer is None else self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def printer(self, prompt_ids):
        """A function that prints each new token as it comes (as text once it is whole, or as its
        id), called with None at the end."""
        if self.tokenizer is None:
            def show(token):
                print(*([token] if token is not None else []), end=" " if token is not None else "\n", flush=True)
            return show
        stream = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True, prompt_ids=prompt_ids)
        print(self.tokenizer.decode(prompt_ids, skip_special_tokens=True), end="", flush=True)

        def show(token):
            print(stream.step(token) if token is not None else stream.finish() + "\n", end="", flush=True)
        return show


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="HF model directory (default: a random-weight 15M checkpoint)")
    parser.add_argument("--mesh", default="dp=1,tp=2", help="mesh dims and sizes, e.g. dp=2,tp=2 or pp=2,tp=2,ring=2 (dims: dp, tp, pp, ulysses, ring)")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--chat", action="store_true", help="the prompt as a user message in the model's chat template")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--do-sample", action="store_true")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="compute dtype (default: the checkpoint's)")
    parser.add_argument("--workers", choices=["thread", "process"], default="thread")
    parser.add_argument("--trace", metavar="FILE", help="write the generation's device timelines (Chrome trace JSON)")
    args = parser.parse_args()

    dtorch.init(workers=args.workers)
    directory = args.model or random_checkpoint()
    mesh = parse_mesh(args.mesh)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(directory, device_mesh=mesh,
                                                 dtype=getattr(dtorch, args.dtype) if args.dtype else None)
    dtorch.synchronize()
    print(f"loaded {directory} in {time.perf_counter() - start:.2f} s on {mesh} ({args.workers} workers), "
          f"{model.lm_head.weight.dtype}")

    tokens = Tokens(directory, model.config)
    prompt = np.array([tokens.encode(args.prompt, chat=args.chat)])
    print(f"prompt ({prompt.shape[1]} tokens): {prompt[0].tolist()}")
    show = tokens.printer(prompt[0].tolist())
    steps = model.stream(prompt, args.max_new_tokens, do_sample=args.do_sample, temperature=args.temperature,
                         top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                         **({} if args.model else dict(eos_token_id=None)))   # a checkpoint's generation_config
    new, stamps = [], []
    profiler = dtorch.profiler.profile(mesh) if args.trace else contextlib.nullcontext()
    start = time.perf_counter()
    with profiler:
        for step in steps:
            stamps.append(time.perf_counter())
            new.append(int(step[0]))
            show(new[-1])
    show(None)
    if args.trace:
        print(f"device timelines: {profiler.export_chrome_trace(args.trace)} (chrome://tracing or ui.perfetto.dev)")
    if stamps:
        prefill = stamps[0] - start
        print(f"prefill: {prompt.shape[1] / prefill:.1f} tokens/s ({prefill * 1e3:.1f} ms for {prompt.shape[1]} "
              "tokens and the first new one)")
    if len(stamps) > 1:
        decode = stamps[-1] - stamps[0]
        print(f"decode: {(len(stamps) - 1) / decode:.1f} tokens/s ({decode / (len(stamps) - 1) * 1e3:.2f} ms per "
              "token)")
    print(f"mesh: {mesh}")
    dtorch.synchronize()


if __name__ == "__main__":
    sys.exit(main())
