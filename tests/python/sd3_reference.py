"""An independent numpy reference (float64) of SD3's transformer, written from diffusers'
semantics: the joint sequence concatenated as diffusers concatenates it (image tokens, then text),
the patch embedding as a convolution summed over kernel offsets, the position table from the 2-D
sin-cos formula. ``sd`` is {diffusers key: numpy array}."""
import numpy as np

import diffusion_reference as R


def pos_table(embed_dim, grid, base_size):
    """(grid^2, embed_dim): channels [0, E/2) from the column coordinate, [E/2, E) from the row."""
    def one(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2) / (d / 2.0))
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], 1)
    c = np.arange(grid) / (grid / base_size)
    rows, cols = np.meshgrid(c, c, indexing="ij")
    return np.concatenate([one(embed_dim // 2, cols), one(embed_dim // 2, rows)], 1)


def patch_embed(sd, x, p, max_size):
    """Conv with kernel = stride = p, flattened row-major, plus the cropped table."""
    w, b = R.f64(sd["pos_embed.proj.weight"]), R.f64(sd["pos_embed.proj.bias"])
    B, C, H, W = x.shape
    h, wd = H // p, W // p
    out = np.zeros((B, h, wd, w.shape[0]))
    for i in range(p):
        for j in range(p):
            patch = R.f64(x)[:, :, i::p, j::p][:, :, :h, :wd]            # (B, C, h, w)
            out += np.einsum("bchw,oc->bhwo", patch, w[:, :, i, j])
    tokens = (out + b).reshape(B, h * wd, -1)
    table = R.f64(sd["pos_embed.pos_embed"]).reshape(max_size, max_size, -1)
    top, left = (max_size - h) // 2, (max_size - wd) // 2
    return tokens + table[top:top + h, left:left + wd].reshape(1, h * wd, -1)


def joint_block(sd, prefix, x, c, temb, heads, qk_norm, last, dual=False):
    """One JointTransformerBlock: returns (text stream or None, image stream). ``dual``: SD3.5's
    second attention over the image tokens alone (norm1 gives nine chunks, the last three its shift,
    scale and gate over the same layer-normed tokens)."""
    pre = prefix + "."
    if dual:
        (shift, scale, gate, shift_mlp, scale_mlp, gate_mlp, shift2, scale2,
         gate2) = R.ada_chunks(sd, pre + "norm1", temb, 9)
        nx2 = R.modulate(R.layer_norm(x, 1e-6), scale2, shift2)
    else:
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = R.ada_chunks(sd, pre + "norm1", temb, 6)
    nx = R.modulate(R.layer_norm(x, 1e-6), scale, shift)
    if last:
        c_scale, c_shift = R.ada_chunks(sd, pre + "norm1_context", temb, 2)
        nc = R.modulate(R.layer_norm(c, 1e-6), c_scale, c_shift)
    else:
        c_shift, c_scale, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = R.ada_chunks(sd, pre + "norm1_context",
                                                                                      temb, 6)
        nc = R.modulate(R.layer_norm(c, 1e-6), c_scale, c_shift)
    a = pre + "attn."
    proj = lambda name, t: R.heads(R.linear(sd, a + name, t), heads)
    q = R.qk_norm(sd, a + "norm_q", proj("to_q", nx), qk_norm)
    k = R.qk_norm(sd, a + "norm_k", proj("to_k", nx), qk_norm)
    v = proj("to_v", nx)
    cq = R.qk_norm(sd, a + "norm_added_q", proj("add_q_proj", nc), qk_norm)
    ck = R.qk_norm(sd, a + "norm_added_k", proj("add_k_proj", nc), qk_norm)
    cv = proj("add_v_proj", nc)
    o = R.tokens(R.attention(np.concatenate([q, cq], 2), np.concatenate([k, ck], 2), np.concatenate([v, cv], 2)))
    L = x.shape[1]
    x = x + gate[:, None] * R.linear(sd, a + "to_out.0", o[:, :L])
    if dual:
        a2 = pre + "attn2."
        proj2 = lambda name: R.heads(R.linear(sd, a2 + name, nx2), heads)
        o2 = R.tokens(R.attention(R.qk_norm(sd, a2 + "norm_q", proj2("to_q"), qk_norm),
                                  R.qk_norm(sd, a2 + "norm_k", proj2("to_k"), qk_norm), proj2("to_v")))
        x = x + gate2[:, None] * R.linear(sd, a2 + "to_out.0", o2)
    x = x + gate_mlp[:, None] * R.feed_forward(sd, pre + "ff", R.modulate(R.layer_norm(x, 1e-6), scale_mlp, shift_mlp))
    if last:
        return None, x
    c = c + c_gate[:, None] * R.linear(sd, a + "to_add_out", o[:, L:])
    c = c + c_gate_mlp[:, None] * R.feed_forward(sd, pre + "ff_context",
                                                 R.modulate(R.layer_norm(c, 1e-6), c_scale_mlp, c_shift_mlp))
    return c, x


def transformer(sd, config, latent, context, pooled, timestep):
    """SD3Transformer2DModel's forward: (B, C, H, W) -> (B, out_channels, H, W)."""
    p, heads = config["patch_size"], config["num_attention_heads"]
    x = patch_embed(sd, latent, p, config["pos_embed_max_size"])
    temb = (R.timestep_mlp(sd, "time_text_embed.timestep_embedder", R.timestep_embedding(timestep, 256))
            + R.timestep_mlp(sd, "time_text_embed.text_embedder", pooled))
    c = R.linear(sd, "context_embedder", context)
    for i in range(config["num_layers"]):
        c, x = joint_block(sd, f"transformer_blocks.{i}", x, c, temb, heads, config.get("qk_norm"),
                           i == config["num_layers"] - 1, i in tuple(config.get("dual_attention_layers") or ()))
    scale, shift = R.ada_chunks(sd, "norm_out", temb, 2)
    x = R.linear(sd, "proj_out", R.modulate(R.layer_norm(x, 1e-6), scale, shift))
    B, _, H, W = latent.shape
    out_c = x.shape[-1] // (p * p)
    x = x.reshape(B, H // p, W // p, p, p, out_c)
    return np.einsum("nhwpqc->nchpwq", x).reshape(B, out_c, H, W)
