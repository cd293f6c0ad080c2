"""An independent numpy reference of diffusers' FluxTransformer2DModel (float64 inside), in
diffusers' own form: the single-stream blocks run on the concatenated sequence [text, image], and
the rotary tables are those of the concatenated ids. A state dict is {diffusers key: numpy}."""
import numpy as np

from diffusion_reference import (ada_chunks, attention, f64, feed_forward, heads, layer_norm, linear, modulate,
                                 qk_norm, rotate_interleaved, gelu_tanh, timestep_embedding, timestep_mlp,
                                 tokens)


def rope(axes_dim, ids, theta=10000):
    """FluxPosEmbed: per axis the angles ids[:, axis] * theta^(-2i/dim), i < dim / 2, each angle
    twice in a row; the axes side by side. -> cos, sin (L, sum(axes_dim))."""
    cos, sin = [], []
    for axis, dim in enumerate(axes_dim):
        freqs = theta ** (-np.arange(dim // 2) * 2.0 / dim)
        angles = f64(ids)[:, axis, None] * freqs[None, :]
        cos.append(np.repeat(np.cos(angles), 2, axis=1))
        sin.append(np.repeat(np.sin(angles), 2, axis=1))
    return np.concatenate(cos, 1), np.concatenate(sin, 1)


def flux_attention(sd, prefix, x, n_heads, cos, sin, context=None):
    """FluxAttnProcessor: q, k, v of x (and of the text ``context`` by the added projections, put
    first in the sequence), per-head RMS norms, the rotary embedding over the whole sequence, one
    softmax. -> the image part projected by to_out.0 and the text part by to_add_out, or (single
    blocks: no context) the whole sequence unprojected."""
    q = qk_norm(sd, prefix + ".norm_q", heads(linear(sd, prefix + ".to_q", x), n_heads), "rms_norm")
    k = qk_norm(sd, prefix + ".norm_k", heads(linear(sd, prefix + ".to_k", x), n_heads), "rms_norm")
    v = heads(linear(sd, prefix + ".to_v", x), n_heads)
    if context is not None:
        cq = qk_norm(sd, prefix + ".norm_added_q", heads(linear(sd, prefix + ".add_q_proj", context), n_heads),
                     "rms_norm")
        ck = qk_norm(sd, prefix + ".norm_added_k", heads(linear(sd, prefix + ".add_k_proj", context), n_heads),
                     "rms_norm")
        cv = heads(linear(sd, prefix + ".add_v_proj", context), n_heads)
        q, k, v = (np.concatenate([c, t], axis=2) for c, t in ((cq, q), (ck, k), (cv, v)))
    q, k = rotate_interleaved(q, cos, sin), rotate_interleaved(k, cos, sin)
    o = tokens(attention(q, k, v))
    if context is None:
        return o
    t = context.shape[1]
    return linear(sd, prefix + ".to_out.0", o[:, t:]), linear(sd, prefix + ".to_add_out", o[:, :t])


def double_block(sd, prefix, hidden, context, temb, n_heads, cos, sin):
    """FluxTransformerBlock -> (context, hidden)."""
    shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = ada_chunks(sd, prefix + ".norm1", temb, 6)
    c_shift, c_scale, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = ada_chunks(sd, prefix + ".norm1_context", temb, 6)
    attn, c_attn = flux_attention(sd, prefix + ".attn", modulate(layer_norm(hidden, 1e-6), scale, shift), n_heads,
                                  cos, sin, context=modulate(layer_norm(context, 1e-6), c_scale, c_shift))
    hidden = hidden + gate[:, None] * attn
    hidden = hidden + gate_mlp[:, None] * feed_forward(sd, prefix + ".ff",
                                                       modulate(layer_norm(hidden, 1e-6), scale_mlp, shift_mlp))
    context = context + c_gate[:, None] * c_attn
    context = context + c_gate_mlp[:, None] * feed_forward(
        sd, prefix + ".ff_context", modulate(layer_norm(context, 1e-6), c_scale_mlp, c_shift_mlp))
    return context, hidden


def single_block(sd, prefix, hidden, temb, n_heads, cos, sin):
    """FluxSingleTransformerBlock on the joint sequence [text, image]."""
    shift, scale, gate = ada_chunks(sd, prefix + ".norm", temb, 3)
    norm = modulate(layer_norm(hidden, 1e-6), scale, shift)
    mlp = gelu_tanh(linear(sd, prefix + ".proj_mlp", norm))
    attn = flux_attention(sd, prefix + ".attn", norm, n_heads, cos, sin)
    return hidden + gate[:, None] * linear(sd, prefix + ".proj_out", np.concatenate([attn, mlp], axis=2))


def conditioning(sd, timestep, pooled, guidance=None):
    """time_text_embed of the timestep (and guidance) scaled by 1000 and the pooled text."""
    emb = timestep_mlp(sd, "time_text_embed.timestep_embedder", timestep_embedding(f64(timestep) * 1000, 256))
    if guidance is not None:
        emb = emb + timestep_mlp(sd, "time_text_embed.guidance_embedder",
                                 timestep_embedding(f64(guidance) * 1000, 256))
    return emb + timestep_mlp(sd, "time_text_embed.text_embedder", pooled)


def model(sd, config, hidden, context, pooled, timestep, img_ids, txt_ids, guidance=None):
    """The whole transformer -> (B, N, patch**2 * out_channels)."""
    n_heads = config["num_attention_heads"]
    cos, sin = rope(config["axes_dims_rope"], np.concatenate([txt_ids, img_ids], axis=0))
    temb = conditioning(sd, timestep, pooled, guidance)
    hidden = linear(sd, "x_embedder", hidden)
    context = linear(sd, "context_embedder", context)
    for i in range(config["num_layers"]):
        context, hidden = double_block(sd, f"transformer_blocks.{i}", hidden, context, temb, n_heads, cos, sin)
    t = context.shape[1]
    joint = np.concatenate([context, hidden], axis=1)
    for i in range(config["num_single_layers"]):
        joint = single_block(sd, f"single_transformer_blocks.{i}", joint, temb, n_heads, cos, sin)
    scale, shift = ada_chunks(sd, "norm_out", temb, 2)
    return linear(sd, "proj_out", modulate(layer_norm(joint[:, t:], 1e-6), scale, shift))
