"""RL rollout/update orchestration on two actor groups, driven from this one thread.

    python rl_loop.py [--steps 6] [--off-policy] [--rollout-mesh 0,1] [--update-mesh 2] [--shape 15M|tiny]

A rollout group (a tp mesh of its own devices) samples continuations of a batch of prompts with the
policy, a Llama; an update group, on other devices and possibly another tp size, computes a
REINFORCE step on the policy's output head from those rollouts: for each sampled token a with
hidden state h (the last layer's, after the final norm) and head W,
    d log softmax(W h)_a / dW = (onehot(a) - softmax(W h)) h^T,
weighted by the rollout's advantage (its reward minus the batch's mean) and averaged over the
batch: W <- W + lr / B * sum. DTorch is inference-only: the gradient is written out with the op
set (linear, softmax, a comparison for the one-hot, a transposed matmul). The reward asks for
low token ids: the fraction of sampled tokens below `--target` (default: an eighth of the
vocabulary), which the policy learns to raise.

The new head goes back to the rollout group by one cross-mesh `redistribute_many`, worker to
worker, into the rollout group's own placements. Every rollout is tagged with the weight version it
sampled with. With --off-policy, rollout k+1 samples with version k while the update group computes
update k+1 from rollout k (one step off-policy): the two groups overlap, and the timeline printed at
the end shows it. Without it, each rollout waits for the previous update (on-policy).
"""
import argparse
import contextlib
import time

import numpy as np

import dtorch
from dtorch.models import LlamaConfig, LlamaForCausalLM, parallelize_llama

SHAPES = {
    "tiny": dict(vocab_size=61, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "15M": dict(vocab_size=32000, hidden_size=288, intermediate_size=768, num_hidden_layers=6,
                num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=256, rms_norm_eps=1e-5,
                tie_word_embeddings=False),
}


def build(config, mesh):
    """A Llama laid out over mesh (its one dim is tp), with the values of a fresh init."""
    tp = dtorch.DeviceMesh("cpu", list(np.asarray(mesh.mesh).ravel()), mesh_dim_names=("tp",))
    model = LlamaForCausalLM(config, device_mesh=tp)
    parallelize_llama(model, tp)
    return model


def sync(src, dst, keys=None, progress=False):
    """Gives dst (a model on another group) src's values of keys (default: all), in dst's own
    placements, by one redistribute_many into dst's own tensors: the pieces go worker to worker and
    land in place, so dst never holds two copies of its weights. Returns the bytes moved.
    ``progress``: wait for them with a bar (redistribute_many's)."""
    mine, theirs = src.state_dict(), dst.state_dict()
    keys = list(theirs) if keys is None else list(keys)
    pairs = {}
    for k in keys:   # tied weights are one tensor under two names: written once
        pairs.setdefault(id(theirs[k]), (mine[k], theirs[k]))
    sources = [s if s.dtype == d.dtype else s.to(d.dtype) for s, d in pairs.values()]
    moved = dtorch.redistribute_many(sources, out=[d for _, d in pairs.values()], progress=progress)
    return sum(t.numel() * t.dtype.itemsize for t in moved)


def rewards_of(tokens, prompt_len, target):
    """Per rollout: the fraction of its new tokens whose id is below target."""
    return (np.asarray(tokens)[:, prompt_len:] < target).mean(axis=1)


def reinforce_head_step(learner, tokens, prompt_len, rewards, lr):
    """The REINFORCE step on learner's lm_head from rollouts (tokens: prompts and their sampled
    continuations, (B, P + G)); returns the new head, a DTensor in the head's own layout. Nothing
    is fetched: the ops run on the update group while this thread goes on."""
    tokens = np.asarray(tokens, dtype=np.int64)
    B, T = tokens.shape
    head = learner.lm_head.weight                                        # (V, E)
    mesh = head.device_mesh
    V, E = head.shape
    rep = [dtorch.Replicate()] * mesh.ndim
    ids = dtorch.distribute_tensor(tokens, learner.model.embed_tokens.weight.device_mesh)
    h = learner.model(ids)[:, prompt_len - 1:T - 1, :]                   # (B, G, E): the states that chose them
    p = dtorch.nn.functional.linear(h, head).softmax(dim=-1)              # (B, G, V)
    actions = dtorch.distribute_tensor(tokens[:, prompt_len:, None], mesh, rep)
    vocab = dtorch.arange(V, device_mesh=mesh, placements=rep)
    onehot = (actions == vocab).to(dtorch.float32)                       # (B, G, V)
    advantage = np.asarray(rewards, np.float32) - np.float32(np.mean(rewards))
    adv = dtorch.distribute_tensor(advantage.reshape(B, 1, 1), mesh, rep)
    G = T - prompt_len
    weighted = ((onehot - p) * adv).reshape(B * G, V)
    grad = weighted.transpose(0, 1) @ h.reshape(B * G, E)                 # (V, E)
    return (head + grad * (lr / B)).redistribute(mesh, head.placements)


def run(steps=6, off_policy=False, rollout_ids=(0, 1), update_ids=(2,), shape="tiny", batch=8, prompt_len=4,
        new_tokens=12, lr=2.0, target=None, seed=0, log=print):
    """The loop; returns its history, one dict per step: the weight version the rollout sampled
    with, its mean reward, and the intervals (seconds from the start) of the rollout and the update."""
    config = LlamaConfig(**SHAPES[shape])
    target = config.vocab_size // 8 if target is None else target
    dtorch.manual_seed(seed)
    policy = build(config, dtorch.DeviceMesh("cpu", list(rollout_ids)))
    learner = build(config, dtorch.DeviceMesh("cpu", list(update_ids)))
    sync(policy, learner, progress=None)                                   # one start for both groups (a bar)
    prompts = np.random.default_rng(seed).integers(3, config.vocab_size, (batch, prompt_len))
    history, version, pending, t_start = [], 0, None, time.monotonic()
    for step in range(steps):
        t0 = time.monotonic() - t_start
        tokens = policy.generate(prompts, max_new_tokens=new_tokens, do_sample=True, seed=seed + step, top_k=None,
                                 eos_token_id=None)     # every token, sampled from the whole softmax
        t1 = time.monotonic() - t_start
        rewards = rewards_of(tokens, prompt_len, target)
        entry = dict(step=step, version=version, reward=float(rewards.mean()), rollout=(t0, t1))
        if pending is not None:                                            # one step off-policy: the update
            sync(learner, policy, ["lm_head.weight"])                     # made during this rollout goes in
            version += 1
        learner.lm_head.weight = reinforce_head_step(learner, tokens, prompt_len, rewards, lr)
        issued = time.monotonic() - t_start
        done = {}
        learner.lm_head.weight.sum().future().add_done_callback(lambda f, d=done: d.setdefault(
            "t", time.monotonic() - t_start))
        entry["update"] = (issued, done)
        if off_policy:
            pending = True
        else:
            sync(learner, policy, ["lm_head.weight"])
            version += 1
        history.append(entry)
        log(f"step {step}: rollout with weights v{entry['version']}, reward {entry['reward']:.3f}")
    dtorch.synchronize()
    for entry in history:
        issued, done = entry["update"]
        entry["update"] = (issued, done.get("t", issued))
    return history


def timeline(history, width=72):
    """The rollouts and updates as text bars over the run's length, one line each."""
    end = max(max(e["rollout"][1], e["update"][1]) for e in history)
    scale = width / end if end > 0 else 1.0
    lines = []
    for e in history:
        for name, (a, b) in (("rollout", e["rollout"]), ("update ", e["update"])):
            first = min(int(a * scale), width - 1)
            last = max(first + 1, min(int(b * scale), width))
            bar = " " * first + "#" * (last - first) + " " * (width - last)
            lines.append(f"  step {e['step']} {name} |{bar}| {a:6.2f}-{b:6.2f} s")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--off-policy", action="store_true", help="rollout k+1 overlaps update k")
    ap.add_argument("--rollout-mesh", default="0,1", help="device ids of the rollout group (its tp size)")
    ap.add_argument("--update-mesh", default="2", help="device ids of the update group")
    ap.add_argument("--shape", default="15M", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--lr", type=float, default=50.0)
    ap.add_argument("--target", type=int, default=None, help="rewarded token ids are below this")
    ap.add_argument("--trace", metavar="FILE", help="write both groups' device timelines (Chrome trace JSON)")
    args = ap.parse_args()
    ids = lambda text: tuple(int(d) for d in text.split(","))
    devices = ids(args.rollout_mesh) + ids(args.update_mesh)
    profiler = dtorch.profiler.profile(*devices) if args.trace else contextlib.nullcontext()
    with profiler:
        history = run(args.steps, args.off_policy, ids(args.rollout_mesh), ids(args.update_mesh), args.shape,
                      args.batch, new_tokens=args.new_tokens, lr=args.lr, target=args.target)
    if args.trace:
        print(f"device timelines: {profiler.export_chrome_trace(args.trace)}")
    print(f"timeline ({'one step off-policy' if args.off_policy else 'on-policy'}):")
    print(timeline(history))
    rewards = [e["reward"] for e in history]
    print(f"reward: first {rewards[0]:.3f}, last {rewards[-1]:.3f}")
    dtorch.shutdown()


if __name__ == "__main__":
    main()
