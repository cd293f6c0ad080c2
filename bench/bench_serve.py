"""Serving throughput and latency with continuous batching, over HTTP, against one request at a time.

    .venv/bin/python bench/bench_serve.py [--clients 1,4,16] [--requests 4] [--tokens 32]

Starts dtorch-serve through examples/serve.py on the 15M-shape random checkpoint (one device) twice:
with --max-batch 16 (continuous batching) and with --max-batch 1 (the same model served one request
at a time). For each number of clients, every client sends `--requests` streaming requests one
after another (a prompt of 9 tokens, `--tokens` new ones, greedy) and the arrival time of every token is taken:
throughput (new tokens per second over the whole run), time to first token (median and p99) and
the gap between tokens of one request (p50, p99). It prints figures and never asserts on them.
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
    return [_request(url, [1] + [3 + (k * 7 + i) % 250 for i in range(8)], tokens) for _ in range(requests)]


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
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
    base = rows["one request at a time"]
    for c in counts:
        print(f"  {c} clients: continuous batching gives {rows['continuous batching (16 rows)'][c][0] / base[c][0]:.2f}x "
              f"the throughput of one request at a time")


if __name__ == "__main__":
    main()
