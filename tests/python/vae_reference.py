"""An independent numpy AutoencoderKL (float64 inside), written from diffusers' semantics: the
parameter names and shapes of a checkpoint, ResnetBlock2D, the mid block's spatial attention,
Upsample2D, Downsample2D, the Encoder and Decoder, and DiagonalGaussianDistribution. A state dict
is {diffusers key: numpy array}; a config is a dict of AutoencoderKL's arguments (``config``
fills in diffusers' defaults)."""
import numpy as np

from diffusion_reference import f64, linear, silu, softmax

DEFAULTS = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                up_block_types=("UpDecoderBlock2D",), block_out_channels=(64,), layers_per_block=1,
                latent_channels=4, norm_num_groups=32, use_quant_conv=True, use_post_quant_conv=True,
                mid_block_add_attention=True)
EPS = 1e-6   # every group norm of the VAE


def config(**overrides):
    cfg = dict(DEFAULTS)
    cfg.update(overrides)
    return cfg


# ---- the checkpoint's tensors --------------------------------------------------------------------

def _conv(shapes, prefix, cin, cout, k):
    shapes[prefix + ".weight"] = (cout, cin, k, k)
    shapes[prefix + ".bias"] = (cout,)


def _norm(shapes, prefix, c):
    shapes[prefix + ".weight"] = (c,)
    shapes[prefix + ".bias"] = (c,)


def _resnet_shapes(shapes, prefix, cin, cout):
    _norm(shapes, prefix + ".norm1", cin)
    _conv(shapes, prefix + ".conv1", cin, cout, 3)
    _norm(shapes, prefix + ".norm2", cout)
    _conv(shapes, prefix + ".conv2", cout, cout, 3)
    if cin != cout:
        _conv(shapes, prefix + ".conv_shortcut", cin, cout, 1)


def _mid_shapes(shapes, prefix, c, attention):
    _resnet_shapes(shapes, prefix + ".resnets.0", c, c)
    if attention:
        a = prefix + ".attentions.0"
        _norm(shapes, a + ".group_norm", c)
        for name in ("to_q", "to_k", "to_v", "to_out.0"):
            shapes[f"{a}.{name}.weight"] = (c, c)
            shapes[f"{a}.{name}.bias"] = (c,)
    _resnet_shapes(shapes, prefix + ".resnets.1", c, c)


def weight_shapes(cfg):
    """{key: shape} of every tensor of an AutoencoderKL checkpoint of ``cfg``."""
    ch, n, lat = list(cfg["block_out_channels"]), cfg["layers_per_block"], cfg["latent_channels"]
    attention = cfg["mid_block_add_attention"]
    shapes = {}
    _conv(shapes, "encoder.conv_in", cfg["in_channels"], ch[0], 3)
    cout = ch[0]
    for i, c in enumerate(ch):
        cin, cout = cout, c
        for j in range(n):
            _resnet_shapes(shapes, f"encoder.down_blocks.{i}.resnets.{j}", cin if j == 0 else cout, cout)
        if i < len(ch) - 1:
            _conv(shapes, f"encoder.down_blocks.{i}.downsamplers.0.conv", cout, cout, 3)
    _mid_shapes(shapes, "encoder.mid_block", ch[-1], attention)
    _norm(shapes, "encoder.conv_norm_out", ch[-1])
    _conv(shapes, "encoder.conv_out", ch[-1], 2 * lat, 3)
    if cfg["use_quant_conv"]:
        _conv(shapes, "quant_conv", 2 * lat, 2 * lat, 1)
    if cfg["use_post_quant_conv"]:
        _conv(shapes, "post_quant_conv", lat, lat, 1)
    rev = ch[::-1]
    _conv(shapes, "decoder.conv_in", lat, rev[0], 3)
    _mid_shapes(shapes, "decoder.mid_block", rev[0], attention)
    cout = rev[0]
    for i, c in enumerate(rev):
        cin, cout = cout, c
        for j in range(n + 1):
            _resnet_shapes(shapes, f"decoder.up_blocks.{i}.resnets.{j}", cin if j == 0 else cout, cout)
        if i < len(rev) - 1:
            _conv(shapes, f"decoder.up_blocks.{i}.upsamplers.0.conv", cout, cout, 3)
    _norm(shapes, "decoder.conv_norm_out", ch[0])
    _conv(shapes, "decoder.conv_out", ch[0], cfg["out_channels"], 3)
    return shapes


# ---- layers ----------------------------------------------------------------------------------------

def conv2d(x, weight, bias=None, stride=1, padding=0):
    """torch's conv2d (groups 1, dilation 1) as a sum over kernel offsets: x (B, Cin, H, W), weight
    (Cout, Cin, kh, kw) -> (B, Cout, Ho, Wo)."""
    x, w = f64(x), f64(weight)
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    _, _, H, W = x.shape
    cout, _, kh, kw = w.shape
    ho, wo = (H - kh) // stride + 1, (W - kw) // stride + 1
    out = np.zeros((x.shape[0], cout, ho, wo))
    for i in range(kh):
        for j in range(kw):
            window = x[:, :, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride]
            out += np.einsum("bchw,oc->bohw", window, w[:, :, i, j])
    if bias is not None:
        out += f64(bias)[None, :, None, None]
    return out


def group_norm(x, groups, weight, bias, eps=EPS):
    """Each sample's channels in ``groups`` groups normalised over (channels of the group, H, W)."""
    B, C = x.shape[:2]
    g = x.reshape(B, groups, -1)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    shape = (1, C) + (1,) * (x.ndim - 2)
    return g.reshape(x.shape) * f64(weight).reshape(shape) + f64(bias).reshape(shape)


def conv(sd, prefix, x, stride=1, padding=None):
    w = sd[prefix + ".weight"]
    pad = w.shape[-1] // 2 if padding is None else padding
    return conv2d(x, w, sd.get(prefix + ".bias"), stride, pad)


def norm(sd, prefix, x, groups):
    return group_norm(x, groups, sd[prefix + ".weight"], sd[prefix + ".bias"])


def resnet(sd, prefix, x, groups):
    h = conv(sd, prefix + ".conv1", silu(norm(sd, prefix + ".norm1", x, groups)))
    h = conv(sd, prefix + ".conv2", silu(norm(sd, prefix + ".norm2", h, groups)))
    shortcut = conv(sd, prefix + ".conv_shortcut", x) if prefix + ".conv_shortcut.weight" in sd else x
    return shortcut + h


def attention(sd, prefix, x, groups):
    """One head over the H*W positions, head dim = channels, plus the input."""
    B, C, H, W = x.shape
    t = norm(sd, prefix + ".group_norm", x, groups).reshape(B, C, H * W).transpose(0, 2, 1)   # (B, L, C)
    q, k, v = (linear(sd, f"{prefix}.{name}", t) for name in ("to_q", "to_k", "to_v"))
    o = softmax(q @ k.transpose(0, 2, 1) / np.sqrt(C)) @ v
    o = linear(sd, prefix + ".to_out.0", o)
    return o.transpose(0, 2, 1).reshape(B, C, H, W) + x


def upsample(sd, prefix, x):
    return conv(sd, prefix + ".conv", np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))


def downsample(sd, prefix, x):
    x = np.pad(x, ((0, 0), (0, 0), (0, 1), (0, 1)))
    return conv(sd, prefix + ".conv", x, stride=2, padding=0)


def mid_block(sd, prefix, x, groups):
    x = resnet(sd, prefix + ".resnets.0", x, groups)
    if prefix + ".attentions.0.to_q.weight" in sd:
        x = attention(sd, prefix + ".attentions.0", x, groups)
    return resnet(sd, prefix + ".resnets.1", x, groups)


# ---- the model --------------------------------------------------------------------------------------

def encoder(sd, cfg, x):
    g, n, blocks = cfg["norm_num_groups"], cfg["layers_per_block"], len(cfg["block_out_channels"])
    h = conv(sd, "encoder.conv_in", f64(x))
    for i in range(blocks):
        for j in range(n):
            h = resnet(sd, f"encoder.down_blocks.{i}.resnets.{j}", h, g)
        if i < blocks - 1:
            h = downsample(sd, f"encoder.down_blocks.{i}.downsamplers.0", h)
    h = mid_block(sd, "encoder.mid_block", h, g)
    return conv(sd, "encoder.conv_out", silu(norm(sd, "encoder.conv_norm_out", h, g)))


def decoder(sd, cfg, z):
    g, n, blocks = cfg["norm_num_groups"], cfg["layers_per_block"], len(cfg["block_out_channels"])
    h = mid_block(sd, "decoder.mid_block", conv(sd, "decoder.conv_in", f64(z)), g)
    for i in range(blocks):
        for j in range(n + 1):
            h = resnet(sd, f"decoder.up_blocks.{i}.resnets.{j}", h, g)
        if i < blocks - 1:
            h = upsample(sd, f"decoder.up_blocks.{i}.upsamplers.0", h)
    return conv(sd, "decoder.conv_out", silu(norm(sd, "decoder.conv_norm_out", h, g)))


def gaussian(moments):
    """DiagonalGaussianDistribution: (mean, logvar, std, var) of moments (B, 2 * latent, h, w)."""
    mean, logvar = np.split(f64(moments), 2, axis=1)
    logvar = np.clip(logvar, -30.0, 20.0)
    return mean, logvar, np.exp(0.5 * logvar), np.exp(logvar)


def encode(sd, cfg, x):
    """(mean, logvar, std, var) of the posterior of images x."""
    h = encoder(sd, cfg, x)
    return gaussian(conv(sd, "quant_conv", h) if "quant_conv.weight" in sd else h)


def decode(sd, cfg, z):
    z = f64(z)
    return decoder(sd, cfg, conv(sd, "post_quant_conv", z) if "post_quant_conv.weight" in sd else z)
