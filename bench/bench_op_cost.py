"""The user thread's cost of one op, op by op, beside numpy's own cost of the same op.

    .venv/bin/python bench/bench_op_cost.py              # --n 100000 --repeats 5 --modes thread,process

Every op runs on small operands (what a decode step issues: the work is nothing, the cost is the
call) on a 2-device mesh, Replicate, in a loop of ``--n`` calls whose results are dropped at once;
the figure is the user thread's CPU time per call (``time.thread_time``: on 2 cores the device
threads preempt the user's thread, which wall time would count as the op's), the best of
``--repeats`` loops, then one ``synchronize()`` outside the timing. numpy runs the same op on the
same shapes in the same run: ``a + b``, ``a * b``, ``np.exp(a)``, ``np.full``, ``reshape``,
``x[0]``, strided views of a (4, 4) ``s`` (``s[:, 0]``, ``s[..., 1:3]``, ``s.transpose()`` for the
method ``s.t()``, the property ``s.T`` for ``s.T``, ``swapaxes``),
``x @ w.T + bias`` for ``F.linear`` and max-shift-exp-sum-divide for ``softmax`` (numpy
has no single call for those two). An empty loop's cost per iteration is printed and subtracted
from both sides.
"""
import argparse
import time

import numpy as np

import dtorch
from dtorch.nn import functional as F


def _per_call(body, n, repeats):
    """Best CPU time per call of body(n) (which loops n times itself)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        body(n)
        best = min(best, time.thread_time() - t0)
    return best / n


def _cases(mesh):
    """(name, dtorch loop, numpy loop) for every op measured."""
    a, b = dtorch.ones((1,), device_mesh=mesh), dtorch.full((1,), 2.0, device_mesh=mesh)
    x, w, bias = (dtorch.ones((1, 4), device_mesh=mesh), dtorch.ones((4, 4), device_mesh=mesh),
                  dtorch.zeros((4,), device_mesh=mesh))
    s, ns = dtorch.ones((4, 4), device_mesh=mesh), np.ones((4, 4), np.float32)   # strided views of s
    na, nb = np.ones(1, np.float32), np.full(1, 2.0, np.float32)
    nx, nw, nbias = np.ones((1, 4), np.float32), np.ones((4, 4), np.float32), np.zeros(4, np.float32)
    full, exp, linear, softmax = dtorch.full, dtorch.exp, F.linear, F.softmax
    nfull, nexp = np.full, np.exp

    def loops(d, n_):
        def run_d(n):
            for _ in range(n):
                d()

        def run_n(n):
            for _ in range(n):
                n_()
        return run_d, run_n

    def np_softmax():
        e = nexp(nx - nx.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return [
        ("a + b", *loops(lambda: a + b, lambda: na + nb)),
        ("a * b", *loops(lambda: a * b, lambda: na * nb)),
        ("exp(a)", *loops(lambda: exp(a), lambda: nexp(na))),
        ("full((4,), 1.0)", *loops(lambda: full((4,), 1.0, device_mesh=mesh), lambda: nfull((4,), 1.0))),
        ("x.reshape(4)", *loops(lambda: x.reshape(4), lambda: nx.reshape(4))),
        ("x[0]", *loops(lambda: x[0], lambda: nx[0])),
        ("s[:, 0]", *loops(lambda: s[:, 0], lambda: ns[:, 0])),
        ("s[..., 1:3]", *loops(lambda: s[..., 1:3], lambda: ns[..., 1:3])),
        ("s.t()", *loops(lambda: s.t(), lambda: ns.transpose())),
        ("s.T", *loops(lambda: s.T, lambda: ns.T)),
        ("s.transpose(0, 1)", *loops(lambda: s.transpose(0, 1), lambda: ns.swapaxes(0, 1))),
        ("linear(x, w, bias)", *loops(lambda: linear(x, w, bias), lambda: nx @ nw.T + nbias)),
        ("softmax(x, -1)", *loops(lambda: softmax(x, -1), np_softmax)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default="thread,process")
    args = parser.parse_args()

    def empty(n):
        for _ in range(n):
            pass
    empty_us = _per_call(empty, args.n, args.repeats) * 1e6
    print(f"user thread CPU per call (us), best of {args.repeats} loops of {args.n}, 2-device mesh; "
          f"an empty loop iteration ({empty_us * 1e3:.0f} ns) subtracted")
    print(f"  {'op':22} {'workers':8} {'DTorch':>8} {'numpy':>8} {'DT/numpy':>9}")
    for mode in args.modes.split(","):
        dtorch.shutdown()
        dtorch.init(workers=mode)
        mesh = dtorch.DeviceMesh("cpu", [0, 1])
        for name, run_d, run_n in _cases(mesh):
            run_d(args.n // 10)
            dtorch.synchronize()
            ours = _per_call(run_d, args.n, args.repeats) * 1e6 - empty_us
            dtorch.synchronize()
            theirs = _per_call(run_n, args.n, args.repeats) * 1e6 - empty_us
            print(f"  {name:22} {mode:8} {ours:8.3f} {theirs:8.3f} {ours / theirs:8.2f}x")
    dtorch.shutdown()


if __name__ == "__main__":
    main()
