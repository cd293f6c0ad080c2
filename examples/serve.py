"""dtorch-serve (the package's OpenAI-compatible server, dtorch.serve) on demo checkpoints.

    pip install ".[serve]"
    python examples/serve.py --port 8000                   # two random-weight demo models
    python examples/serve.py MODEL_DIR --mesh tp=2 ...     # any dtorch-serve command line

Without a model on the command line (no MODEL_DIR nor --model), two random-weight Llamas are
written once (llama2.c's 15M shape and a smaller one) and served as "15M" and "tiny", each on a
device of its own. They have no tokenizer, so their prompts are token ids and their text is empty
(ask for "return_token_ids": true to see the tokens). Every other argument is dtorch-serve's
(`python examples/serve.py --help`), e.g. --max-num-seqs 1 to serve one request at a time.
"""
import os
import sys

import dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM
from dtorch.serve import main, parser

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama import TINY_15M  # noqa: E402  (the demo's 15M shape)

SMALL = dict(TINY_15M, hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4)


def random_checkpoint(name, shape):
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(cache, "dtorch", f"llama-{name}-random")
    if not os.path.exists(os.path.join(directory, "model.safetensors")):
        dtorch.init()
        dtorch.manual_seed(len(name))
        LlamaForCausalLM(LlamaConfig(**shape)).save_pretrained(directory)
        dtorch.shutdown()
    return directory


def demo_argv(argv):
    """The command line with the demo models added when it names none."""
    args = parser().parse_args(argv)
    if args.model_dir is not None or args.model:
        return argv
    return ["--model", f"15M={random_checkpoint('15m', TINY_15M)}",
            "--model", f"tiny={random_checkpoint('small', SMALL)}", *argv]


if __name__ == "__main__":
    sys.exit(main(demo_argv(sys.argv[1:])))
