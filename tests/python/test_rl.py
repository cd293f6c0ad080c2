"""The RL rollout/update loop of examples/rl_loop.py: its REINFORCE step on the output head against
a numpy computation of the same step (from the independent numpy Llama's hidden states), the weight
sync between groups of different tp sizes worker to worker, and the weight versions the rollouts
are tagged with, on- and off-policy."""
import os
import sys

import numpy as np
import pytest

import dtorch
import llama_reference as ref
from dtorch.models import LlamaConfig

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import rl_loop  # noqa: E402


def _config():
    """Six heads, so that tp sizes 1, 2 and 3 all divide them; vocab 61 is uneven over each."""
    return ref.tiny_config(hidden_size=48, num_attention_heads=6, num_key_value_heads=6)


def _model(cfg, sd, ids):
    model = rl_loop.build(LlamaConfig.from_dict(cfg), dtorch.DeviceMesh("cpu", list(ids)))
    model.load_state_dict(sd)
    return model


def _numpy_step(sd, cfg, tokens, prompt_len, rewards, lr):
    """REINFORCE on the head, from the paper's gradient of log softmax, in float64."""
    W = np.asarray(sd["lm_head.weight"], np.float64)
    B, T = tokens.shape
    h = ref.hidden_states(sd, cfg, tokens)[:, prompt_len - 1:T - 1]          # (B, G, E)
    logits = h @ W.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(W.shape[0])[tokens[:, prompt_len:]]
    adv = rewards - rewards.mean()
    grad = sum(adv[b] * (onehot[b] - p[b]).T @ h[b] for b in range(B))       # (V, E)
    return W + lr / B * grad


@pytest.mark.parametrize("update_ids", [(2,), (2, 3), (2, 3, 4)], ids=["tp1", "tp2", "tp3"])
def test_reinforce_step_matches_numpy(mode, update_ids):
    cfg = _config()
    sd = ref.random_weights(cfg, 4)
    learner = _model(cfg, sd, update_ids)
    tokens = np.random.default_rng(2).integers(0, cfg["vocab_size"], (3, 10))
    rewards = np.array([0.2, 0.5, 0.9])
    new = rl_loop.reinforce_head_step(learner, tokens, 4, rewards, lr=3.0)
    assert new.placements == learner.lm_head.weight.placements and new.device_mesh == learner.lm_head.weight.device_mesh
    want = _numpy_step(sd, cfg, tokens, 4, rewards, 3.0)
    got = new.numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
    assert np.abs(want - sd["lm_head.weight"]).max() > 1e-2     # the step moved the head


def test_sync_goes_worker_to_worker_into_the_other_groups_layout(mode):
    cfg = _config()
    sd = ref.random_weights(cfg, 5)
    policy, learner = _model(cfg, sd, (0, 1)), _model(cfg, sd, (2, 3, 4))
    placements = policy.lm_head.weight.placements
    head = sd["lm_head.weight"] * 0.5 + 0.25
    learner.load_state_dict({"lm_head.weight": head}, strict=False)
    rollout = dtorch.DeviceMesh("cpu", [0, 1])
    before = sum(s["peer_bytes_received"] for s in dtorch.device_stats(rollout))
    kept = policy.lm_head.weight
    moved = rl_loop.sync(learner, policy, ["lm_head.weight"])
    assert moved == head.size * 4
    got = policy.lm_head.weight
    assert got is kept                         # written in place: the policy's own tensor
    assert got.placements == placements and sorted(got.device_mesh.mesh.ravel().tolist()) == [0, 1]
    np.testing.assert_array_equal(got.numpy(), head)
    after = sum(s["peer_bytes_received"] for s in dtorch.device_stats(rollout))
    assert after - before >= head.size * 4     # the rollout devices received the pieces from their peers
    ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], (2, 5))
    want = ref.logits(dict(sd, **{"lm_head.weight": head}), cfg, ids)
    got_logits = policy(ids).logits.numpy()
    assert np.abs(got_logits - want).max() / np.abs(want).max() < 1e-4


@pytest.mark.parametrize("off_policy, versions", [(False, [0, 1, 2, 3]), (True, [0, 0, 1, 2])],
                         ids=["on-policy", "off-policy"])
def test_rollouts_are_tagged_with_the_weights_they_used(mode, off_policy, versions):
    history = rl_loop.run(steps=4, off_policy=off_policy, rollout_ids=(0, 1), update_ids=(2,), shape="tiny",
                          batch=4, new_tokens=6, log=lambda *_: None)
    assert [e["version"] for e in history] == versions
    assert all(0.0 <= e["reward"] <= 1.0 for e in history)
    for e in history:
        (r0, r1), (u0, u1) = e["rollout"], e["update"]
        assert r0 <= r1 <= u0 <= u1      # an update starts from its own rollout
