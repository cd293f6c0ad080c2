"""Serving throughput and latency with continuous batching, over HTTP, against one request at a time
and against HF transformers' generate on a static batch.

    .venv/bin/python bench/bench_serve.py [--clients 1,4,16,64] [--requests 3] [--tokens 32] \
        [--hf-python /path/to/venv/bin/python]

Starts dtorch-serve through examples/serve.py on the 15M-shape random checkpoint (one device) twice:
with --max-batch 16 (continuous batching) and with --max-batch 1 (the same model served one request
at a time). For each number of clients, every client sends `--requests` streaming requests one
after another (a prompt of 9 tokens, `--tokens` new ones, greedy) and the arrival time of every token is taken:
throughput (new tokens per second over the whole run), time to first token (median and p99) and
the gap between tokens of one request (p50, p99).

With --hf-python (a Python with torch and transformers, a venv of its own: DTorch does not need
them), the same checkpoint is run by transformers' LlamaForCausalLM.generate on one torch thread
(the server's model runs on one device, one worker thread) on a static batch of as many of the same
prompts as there are clients, `--tokens` new tokens each (min_new_tokens as well, so none stops
early), `--requests` times: its tokens per second, with no HTTP at all, and its time to the first
token (a generate of one new token for the whole batch). It prints figures and never asserts on them.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse

SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "serve.py")


def _start(max_batch):
    proc = subprocess.Popen([sys.executable, SERVE, "--max-batch", str(max_batch), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    return proc, urllib.parse.urlparse(line.split(" at ")[1].strip())


def _request(url, prompt, tokens):
    """(seconds to first token, gaps between tokens, tokens) of one streaming request."""
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps({"model": "15M", "prompt": prompt, "max_tokens": tokens,
                                                        "temperature": 0, "stream": True,
                                                        "return_token_ids": True}))
    r = conn.getresponse()
    stamps = []
    for line in r:
        if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["token_ids"]:
            stamps.append(time.perf_counter())
    conn.close()
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])], len(stamps)


def _client(url, k, requests, tokens):
    return [_request(url, _prompt(k), tokens) for _ in range(requests)]


def _pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _run(url, clients, requests, tokens):
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = [r for rs in pool.map(lambda k: _client(url, k, requests, tokens), range(clients)) for r in rs]
    wall = time.perf_counter() - t0
    ttft = [r[0] for r in results]
    gaps = [g for r in results for g in r[1]]
    made = sum(r[2] for r in results)
    return made / wall, statistics.median(ttft), _pct(ttft, 0.99), statistics.median(gaps), _pct(gaps, 0.99)


def _prompt(k):
    return [1] + [3 + (k * 7 + i) % 250 for i in range(8)]


# Run by --hf-python: transformers' generate on static batches of the clients' prompts; one JSON
# line per batch size: [clients, new tokens per second, seconds to the first token].
_HF = """
import json, sys, time
import torch, transformers
torch.set_num_threads(1)
directory, counts, requests, tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
prompt = lambda k: [1] + [3 + (k * 7 + i) % 250 for i in range(8)]
model = transformers.LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
with torch.inference_mode():
    model.generate(torch.tensor([prompt(0)]), max_new_tokens=4, do_sample=False)          # warm
    for c in counts:
        ids = torch.tensor([prompt(k) for k in range(c)])
        first = []
        for _ in range(3):
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False)
            first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(requests):
            out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        wall = time.perf_counter() - t0
        print(json.dumps([c, c * (out.shape[1] - ids.shape[1]) * requests / wall, sorted(first)[1]]), flush=True)
"""


def _hf(python, counts, requests, tokens):
    sys.path.insert(0, os.path.join(os.path.dirname(SERVE)))
    from serve import random_checkpoint      # the checkpoint the server loads
    from llama import TINY_15M
    out = subprocess.run([python, "-c", _HF, random_checkpoint("15m", TINY_15M), json.dumps(counts), str(requests),
                          str(tokens)], check=True, capture_output=True, text=True).stdout
    return {c: (tps, ttft) for c, tps, ttft in (json.loads(line) for line in out.splitlines() if line.startswith("["))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--hf-python", help="a Python with torch and transformers: HF's static batch beside")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    rows = {}
    for label, batch in (("continuous batching (16 rows)", 16), ("one request at a time", 1)):
        proc, url = _start(batch)
        try:
            _run(url, 1, 1, 4)   # warm
            rows[label] = {c: _run(url, c, args.requests, args.tokens) for c in counts}
        finally:
            proc.terminate()
            proc.wait()
    print(f"15M shape, one cpu device, {args.requests} requests per client of 9 prompt + {args.tokens} new tokens")
    print(f"  {'server':31s} {'clients':>7s} {'tok/s':>8s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'gap p50':>8s} "
          f"{'gap p99':>8s}")
    for label, by in rows.items():
        for c, (tps, t50, t99, g50, g99) in by.items():
            print(f"  {label:31s} {c:7d} {tps:8.1f} {t50 * 1e3:7.1f}ms {t99 * 1e3:7.1f}ms {g50 * 1e3:6.1f}ms "
                  f"{g99 * 1e3:6.1f}ms")
    hf = _hf(args.hf_python, counts, args.requests, args.tokens) if args.hf_python else {}
    for c, (tps, ttft) in hf.items():
        print(f"  {'HF generate, static batch':31s} {c:7d} {tps:8.1f} {ttft * 1e3:7.1f}ms")
    base, batched = rows["one request at a time"], rows["continuous batching (16 rows)"]
    for c in counts:
        print(f"  {c} clients: continuous batching gives {batched[c][0] / base[c][0]:.2f}x the throughput of one "
              f"request at a time" + (f", {batched[c][0] / hf[c][0]:.2f}x HF's static batch" if c in hf else "") +
              f"; TTFT p50 {batched[c][1] / base[1][1] if 1 in base else float('nan'):.1f}x one request alone's")


if __name__ == "__main__":
    main()
