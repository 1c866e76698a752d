#!/usr/bin/python3
"""Independent numpy re-implementation of the Hugging Face forward pass of the families ferry
computes, written from the transformers modeling code (not from ferry's): Llama, Mistral,
Mixtral, Qwen2, Qwen2-MoE, OLMoE, Qwen3, Qwen3-MoE, Gemma 2, Gemma 3, Phi-3.5-MoE, GPT-NeoX,
Llama 4 (text), DeepSeek-V2/V3 (MLA computed the plain way: K and V decompressed), gpt-oss and
BLOOM. Norms in fp32, RoPE with each scaling type's frequencies, causal attention with
windows, chunks, soft-capping, sinks and ALiBi, each family's router. Used to check that ferry's
logits match within float rounding.

usage: hf_reference.py MODEL_DIR DUMP.jsonl [--tolerance 1e-4]
DUMP.jsonl is written by `ferry run --dump-logits`: one row per generated token with the input
token ids of its sequence and ferry's logits for the last position."""
import json
import math
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64}


def load_safetensors(path, out):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[t["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(t["shape"]) if t["shape"] else arr


def load_weights(model_dir):
    w = {}
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        shards = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    for s in shards:
        load_safetensors(os.path.join(model_dir, s), w)
    return w


# ---- building blocks ----------------------------------------------------------------------

def rmsnorm(x, w, eps, offset=False):
    var = np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True)
    y = x / np.sqrt(var + eps)
    if w is None:
        return y
    return y * (1.0 + w) if offset else w * y


def layernorm(x, w, b, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def inv_freq(rope, dim, seq_len):
    """transformers' ROPE_INIT_FUNCTIONS: (inv_freq, attention scaling) for a rope dict."""
    base, typ = rope["theta"], rope.get("type", "default")
    ar = np.arange(0, dim, 2, dtype=np.float64) / dim
    if typ == "dynamic":
        mp = rope["max_position"]
        if seq_len > mp:
            base = base * ((rope["factor"] * seq_len / mp) - (rope["factor"] - 1)) ** (dim / (dim - 2))
    inv = 1.0 / base ** ar
    att = 1.0
    if typ == "linear":
        inv = inv / rope["factor"]
    elif typ == "llama3":
        f, lo, hi, old = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"], rope["original"]
        wl = 2 * math.pi / inv
        out = np.where(wl > old / lo, inv / f, inv)
        if hi > lo:
            smooth = (old / wl - lo) / (hi - lo)
            med = ~(wl < old / hi) & ~(wl > old / lo)
            out = np.where(med, (1 - smooth) * out / f + smooth * out, out)
        inv = out
    elif typ == "yarn":
        orig = rope.get("original") or rope["max_position"]
        factor = rope["max_position"] / orig if rope.get("original") else rope["factor"]

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
        if rope.get("attention_factor"):
            att = rope["attention_factor"]
        elif rope.get("mscale") and rope.get("mscale_all_dim"):
            att = mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
        else:
            att = mscale(factor)
        bf, bs = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

        def cdim(rot):
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(rope["theta"]))
        low, high = cdim(bf), cdim(bs)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extra = 1 - ramp
        pos = rope["theta"] ** ar
        inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    elif typ == "longrope":
        orig = rope["original"]
        longer = seq_len > orig
        f = np.array(rope["long_factor"] if longer else rope["short_factor"], dtype=np.float64)
        inv = inv / f
        m = rope.get("long_mscale" if longer else "short_mscale")
        if m:
            att = m
        else:
            factor = rope["max_position"] / orig
            att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return inv.astype(np.float32), att


def apply_rope(x, pos, rope, dim, interleaved=False):
    """x: [heads, T, d]; rotates x[..., :dim] (halves, or pairs (2i, 2i+1) as complex numbers)."""
    inv, att = inv_freq(rope, dim, len(pos))
    ang = np.outer(pos.astype(np.float64), inv.astype(np.float64))
    cos, sin = (np.cos(ang) * att).astype(np.float32), (np.sin(ang) * att).astype(np.float32)
    r, rest = x[..., :dim], x[..., dim:]
    if interleaved:
        a, b = r[..., 0::2], r[..., 1::2]
        out = np.empty_like(r)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    else:
        h = dim // 2
        a, b = r[..., :h], r[..., h:]
        out = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return np.concatenate([out, rest], axis=-1)


def attend(q, k, v, scale, mask, softcap=0.0, sinks=None, bias=None):
    """q [H, T, d], k/v [H, T, d] (already repeated); mask [T, T] bool."""
    s = q @ k.transpose(0, 2, 1) * scale
    if bias is not None:
        s = s + bias
    if softcap:
        s = np.tanh(s / softcap) * softcap
    s = np.where(mask, s, -np.inf)
    if sinks is not None:
        sk = np.broadcast_to(sinks[:, None, None], (s.shape[0], s.shape[1], 1))
        c = np.concatenate([s, sk], axis=-1)
        p = softmax(c)[..., :-1]
    else:
        p = softmax(s)
    return p @ v


def causal(T, window=0, chunk=0):
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    m = j <= i
    if window:
        m &= i - j < window
    if chunk:
        m &= (i // chunk) == (j // chunk)
    return m


def alibi_slopes(n):
    p2 = 2 ** math.floor(math.log2(n))
    base = 2 ** (-(2 ** -(math.log2(p2) - 3)))
    s = [base ** i for i in range(1, p2 + 1)]
    if p2 != n:
        extra = 2 ** (-(2 ** -(math.log2(2 * p2) - 3)))
        s += [extra ** i for i in range(1, 2 * min(p2, n - p2) + 1, 2)]
    return np.array(s, dtype=np.float32)


def topk_ids(v, k):
    """indices of the k largest (ties to the lower index), as torch.topk on CPU."""
    return sorted(range(len(v)), key=lambda e: (-v[e], e))[:k]


# ---- configuration --------------------------------------------------------------------------

def rope_dict(cfg, theta, scaling, max_pos):
    r = {"theta": theta, "max_position": max_pos}
    if scaling:
        r["type"] = scaling.get("rope_type", scaling.get("type", "default"))
        if r["type"] == "su":
            r["type"] = "longrope"
        for a, b in [("factor", "factor"), ("original", "original_max_position_embeddings"),
                     ("low_freq_factor", "low_freq_factor"), ("high_freq_factor", "high_freq_factor"),
                     ("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"), ("mscale", "mscale"),
                     ("mscale_all_dim", "mscale_all_dim"), ("attention_factor", "attention_factor"),
                     ("truncate", "truncate"), ("short_factor", "short_factor"), ("long_factor", "long_factor"),
                     ("short_mscale", "short_mscale"), ("long_mscale", "long_mscale")]:
            if scaling.get(b) is not None:
                r[a] = scaling[b]
        if r["type"] == "longrope" and "original" not in r:
            r["original"] = cfg["original_max_position_embeddings"]
    return r


def model_rope(cfg):
    theta = cfg.get("rope_theta", cfg.get("rotary_emb_base", 10000.0))
    scaling = cfg.get("rope_scaling")
    rp = cfg.get("rope_parameters")
    if rp:
        scaling = rp.get("full_attention", rp)
        theta = scaling.get("rope_theta", theta)
    return rope_dict(cfg, theta, scaling, cfg.get("max_position_embeddings", 2048))


# ---- the forward pass -------------------------------------------------------------------------

def experts_out(x, probs_fn, expert_fn, K):
    """x [T, H]: sum over each token's top-k of weight x expert(x)."""
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, g in probs_fn(t):
            out[t] += expert_fn(e, x[t], g)
    return out


def gptj_forward(cfg, w, tokens):
    """GPT-J as transformers' modeling_gptj.py computes it: each block adds attn(ln_1(x)) and
    mlp(ln_1(x)) to x (one LayerNorm for both); q and k rotate their first rotary_dim dimensions
    in interleaved pairs (create_sinusoidal_positions, repeat_interleave of sin and cos,
    rotate_every_two); the MLP is fc_in, gelu_new, fc_out with biases; the head has a bias."""
    H, nh, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    hd = H // nh
    rd = cfg.get("rotary_dim") or hd
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    T = len(tokens)
    h = w["transformer.wte.weight"][np.array(tokens)]
    inv = (1.0 / (10000 ** (np.arange(0, rd, 2, dtype=np.int64) / rd))).astype(np.float32)
    sinusoid = np.einsum("i,j->ij", np.arange(T, dtype=np.float32), inv).astype(np.float32)
    sin = np.repeat(np.sin(sinusoid), 2, axis=-1)[:, None, :]
    cos = np.repeat(np.cos(sinusoid), 2, axis=-1)[:, None, :]

    def rotate_every_two(x):
        return np.stack((-x[..., 1::2], x[..., ::2]), axis=-1).reshape(x.shape)

    def rotary(x):  # (T, heads, head_dim)
        r = x[..., :rd]
        return np.concatenate([r * cos + rotate_every_two(r) * sin, x[..., rd:]], axis=-1)

    mask = causal(T)
    for l in range(L):
        p = "transformer.h.%d." % l
        x = layernorm(h, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        q = rotary((x @ w[p + "attn.q_proj.weight"].T).reshape(T, nh, hd)).transpose(1, 0, 2)
        k = rotary((x @ w[p + "attn.k_proj.weight"].T).reshape(T, nh, hd)).transpose(1, 0, 2)
        v = (x @ w[p + "attn.v_proj.weight"].T).reshape(T, nh, hd).transpose(1, 0, 2)
        a = attend(q, k, v, hd ** -0.5, mask).transpose(1, 0, 2).reshape(T, H) @ w[p + "attn.out_proj.weight"].T
        f = gelu_tanh(x @ w[p + "mlp.fc_in.weight"].T + w[p + "mlp.fc_in.bias"])
        f = f @ w[p + "mlp.fc_out.weight"].T + w[p + "mlp.fc_out.bias"]
        h = h + a + f
    h = layernorm(h, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return h @ w["lm_head.weight"].T + w["lm_head.bias"]


def forward(cfg, w, tokens):
    mt = cfg["model_type"]
    if mt == "gptj":
        return gptj_forward(cfg, w, tokens)
    H = cfg.get("hidden_size", cfg.get("n_embed"))
    nh = cfg.get("num_attention_heads", cfg.get("n_head"))
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    L = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_eps", cfg.get("layer_norm_epsilon", 1e-6)))
    T = len(tokens)
    pos = np.arange(T)
    ids = np.array(tokens)
    gemma = mt in ("gemma2", "gemma3_text")
    rope = model_rope(cfg)
    pre = "model.layers.{}."
    if mt == "gpt_neox":
        h = w["gpt_neox.embed_in.weight"][ids]
        pre = "gpt_neox.layers.{}."
    elif mt == "bloom":
        h = w["word_embeddings.weight"][ids]
        h = layernorm(h, w["word_embeddings_layernorm.weight"], w["word_embeddings_layernorm.bias"], eps)
        pre = "h.{}."
    else:
        h = w["model.embed_tokens.weight"][ids]
        if gemma:
            h = h * np.float32(math.sqrt(H))

    def norm(x, name):
        if mt in ("phimoe", "gpt_neox", "bloom"):
            return layernorm(x, w[name + ".weight"], w[name + ".bias"], eps)
        return rmsnorm(x, w[name + ".weight"], eps, offset=gemma)

    def lin(x, name, bias=True):
        y = x @ w[name + ".weight"].T
        if bias and name + ".bias" in w:
            y = y + w[name + ".bias"]
        return y

    for l in range(L):
        p = pre.format(l)
        # ---- which kind of layer
        window = chunk = 0
        use_rope = mt != "bloom"
        lrope = rope
        if mt in ("mistral",):
            window = cfg.get("sliding_window") or 0
        if mt == "gemma2" and l % 2 == 0:
            window = cfg["sliding_window"]
        if mt == "gemma3_text" and (l + 1) % cfg.get("sliding_window_pattern", 6):
            window = cfg["sliding_window"]
            lrope = {"theta": cfg.get("rope_local_base_freq", 10000.0), "max_position": rope["max_position"]}
        if mt == "gpt_oss" and cfg["layer_types"][l] == "sliding_attention":
            window = cfg["sliding_window"]
        if mt == "phimoe" and cfg.get("sliding_window"):
            window = cfg["sliding_window"]
        if mt == "llama4_text":
            use_rope = (l + 1) % cfg.get("no_rope_layer_interval", 4) != 0
            chunk = cfg.get("attention_chunk_size", 0) if use_rope else 0
        mask = causal(T, window, chunk)
        mlp_in = None

        # ---- attention
        x = norm(h, p + "input_layernorm")
        if mt in ("deepseek_v2", "deepseek_v3"):
            nope, rd, vd, rank = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
            if cfg.get("q_lora_rank"):
                q = rmsnorm(x @ w[p + "self_attn.q_a_proj.weight"].T, w[p + "self_attn.q_a_layernorm.weight"], eps)
                q = q @ w[p + "self_attn.q_b_proj.weight"].T
            else:
                q = x @ w[p + "self_attn.q_proj.weight"].T
            q = q.reshape(T, nh, nope + rd).transpose(1, 0, 2)
            ckv = x @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
            c, kpe = ckv[:, :rank], ckv[:, rank:]
            kv = rmsnorm(c, w[p + "self_attn.kv_a_layernorm.weight"], eps) @ w[p + "self_attn.kv_b_proj.weight"].T
            kv = kv.reshape(T, nh, nope + vd).transpose(1, 0, 2)
            knope, v = kv[..., :nope], kv[..., nope:]
            qpe = apply_rope(q[..., nope:], pos, rope, rd, interleaved=True)
            kpe = apply_rope(kpe[None], pos, rope, rd, interleaved=True)
            qq = np.concatenate([q[..., :nope], qpe], axis=-1)
            kk = np.concatenate([knope, np.broadcast_to(kpe, (nh, T, rd))], axis=-1)
            scale = (nope + rd) ** -0.5
            rs = cfg.get("rope_scaling") or {}
            if rs.get("mscale_all_dim"):
                m = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0
                scale *= m * m
            a = attend(qq, kk, v, scale, mask).transpose(1, 0, 2).reshape(T, nh * vd)
            h = h + a @ w[p + "self_attn.o_proj.weight"].T
        else:
            if mt in ("gpt_neox", "bloom"):
                an = "attention" if mt == "gpt_neox" else "self_attention"
                qkv = lin(x, p + an + ".query_key_value").reshape(T, nh, 3, hd)
                q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
                q, k, v = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)
                oname = p + an + ".dense"
            else:
                q = lin(x, p + "self_attn.q_proj").reshape(T, nh, hd).transpose(1, 0, 2)
                k = lin(x, p + "self_attn.k_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
                v = lin(x, p + "self_attn.v_proj").reshape(T, nkv, hd).transpose(1, 0, 2)
                oname = p + "self_attn.o_proj"
            if mt == "olmoe":
                q = rmsnorm(q.transpose(1, 0, 2).reshape(T, -1), w[p + "self_attn.q_norm.weight"], eps)
                k = rmsnorm(k.transpose(1, 0, 2).reshape(T, -1), w[p + "self_attn.k_norm.weight"], eps)
                q = q.reshape(T, nh, hd).transpose(1, 0, 2)
                k = k.reshape(T, nkv, hd).transpose(1, 0, 2)
            if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
                q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps, offset=gemma)
                k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps, offset=gemma)
            if use_rope:
                rd = hd
                if mt == "gpt_neox":
                    rd = int(hd * cfg.get("rotary_pct", 0.25))
                inter = mt == "llama4_text"
                q, k = apply_rope(q, pos, lrope, rd, inter), apply_rope(k, pos, lrope, rd, inter)
                if mt == "llama4_text" and cfg.get("use_qk_norm", True):
                    q, k = rmsnorm(q, None, eps), rmsnorm(k, None, eps)
            elif mt == "llama4_text" and cfg.get("attn_temperature_tuning", True):
                tf = np.log1p(np.floor((pos + 1.0) / cfg.get("floor_scale", 8192))) * cfg.get("attn_scale", 0.1) + 1.0
                q = q * tf[None, :, None].astype(np.float32)
            rep = nh // k.shape[0]
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
            scale = (cfg["query_pre_attn_scalar"] if gemma else hd) ** -0.5
            bias = None
            if mt == "bloom":
                bias = alibi_slopes(nh)[:, None, None] * pos[None, None, :].astype(np.float32)
            sinks = w[p + "self_attn.sinks"] if mt == "gpt_oss" else None
            softcap = (cfg.get("attn_logit_softcapping") or 0.0) if mt == "gemma2" else 0.0
            a = attend(q, k, v, scale, mask, softcap, sinks, bias).transpose(1, 0, 2).reshape(T, nh * hd)
            o = lin(a, oname)
            if gemma:
                o = rmsnorm(o, w[p + "post_attention_layernorm.weight"], eps, offset=True)
            if mt == "gpt_neox" and cfg.get("use_parallel_residual", True):
                mlp_in = norm(h, p + "post_attention_layernorm")  # of the layer's input
            h = h + o

        # ---- feed-forward
        if gemma:
            x = rmsnorm(h, w[p + "pre_feedforward_layernorm.weight"], eps, offset=True)
        elif mlp_in is not None:
            x = mlp_in
        else:
            x = norm(h, p + "post_attention_layernorm")
        out = ffn(cfg, w, p, l, x, mt)
        if gemma:
            out = rmsnorm(out, w[p + "post_feedforward_layernorm.weight"], eps, offset=True)
        h = h + out

    if mt == "gpt_neox":
        h = layernorm(h, w["gpt_neox.final_layer_norm.weight"], w["gpt_neox.final_layer_norm.bias"], eps)
        return h @ w["embed_out.weight"].T
    if mt == "bloom":
        h = layernorm(h, w["ln_f.weight"], w["ln_f.bias"], eps)
        return h @ w["word_embeddings.weight"].T
    h = norm(h, "model.norm")
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = h @ head.T
    if "lm_head.bias" in w:
        logits = logits + w["lm_head.bias"]
    if mt == "gemma2" and cfg.get("final_logit_softcapping", 30.0):
        c = cfg.get("final_logit_softcapping", 30.0)
        logits = np.tanh(logits / c) * c
    return logits


def mlp(x, w, pre, names=("gate_proj", "up_proj", "down_proj"), act=silu):
    return (act(x @ w[pre + names[0] + ".weight"].T) * (x @ w[pre + names[1] + ".weight"].T)) @ w[
        pre + names[2] + ".weight"].T


def ffn(cfg, w, p, l, x, mt):
    T = x.shape[0]
    if mt in ("gpt_neox", "bloom"):
        act = gelu_tanh if mt == "bloom" or cfg.get("hidden_act", "gelu") != "gelu" else gelu_erf
        y = act(x @ w[p + "mlp.dense_h_to_4h.weight"].T + w[p + "mlp.dense_h_to_4h.bias"])
        return y @ w[p + "mlp.dense_4h_to_h.weight"].T + w[p + "mlp.dense_4h_to_h.bias"]
    if mt in ("gemma2", "gemma3_text"):
        return mlp(x, w, p + "mlp.", act=gelu_tanh)
    if mt in ("llama", "mistral", "qwen2", "qwen3"):
        return mlp(x, w, p + "mlp.")
    if mt == "qwen3_moe" and (l in cfg.get("mlp_only_layers", []) or (l + 1) % cfg.get("decoder_sparse_step", 1)):
        return mlp(x, w, p + "mlp.")
    if mt in ("deepseek_v2", "deepseek_v3") and l < cfg.get("first_k_dense_replace", 0):
        return mlp(x, w, p + "mlp.")
    if mt == "llama4_text" and (l + 1) % cfg.get("interleave_moe_layer_step", 1):
        return mlp(x, w, p + "feed_forward.")
    out = np.zeros_like(x)
    if mt in ("mixtral", "phimoe"):
        router, ex, names = p + "block_sparse_moe.gate.weight", p + "block_sparse_moe.experts.{}.", ("w1", "w3", "w2")
        E, K = cfg.get("num_local_experts", 8), cfg.get("num_experts_per_tok", 2)
    elif mt == "llama4_text":
        router, E, K = p + "feed_forward.router.weight", cfg["num_local_experts"], cfg["num_experts_per_tok"]
    elif mt == "gpt_oss":
        router, E, K = p + "mlp.router.weight", cfg["num_local_experts"], cfg["num_experts_per_tok"]
    elif mt in ("deepseek_v2", "deepseek_v3"):
        router, ex, names = p + "mlp.gate.weight", p + "mlp.experts.{}.", ("gate_proj", "up_proj", "down_proj")
        E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    else:
        router, ex, names = p + "mlp.gate.weight", p + "mlp.experts.{}.", ("gate_proj", "up_proj", "down_proj")
        E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = x @ w[router].T
    if mt == "gpt_oss":
        logits = logits + w[p + "mlp.router.bias"]
    for t in range(T):
        lt = logits[t]
        if mt in ("mixtral", "qwen2_moe", "olmoe", "qwen3_moe"):
            probs = softmax(lt)
            order = topk_ids(probs, K)
            wts = probs[order]
            if mt == "mixtral" or cfg.get("norm_topk_prob", False):
                wts = wts / wts.sum()
        elif mt == "gpt_oss":
            order = topk_ids(lt, K)
            wts = softmax(lt[order])
        elif mt == "llama4_text":
            order = topk_ids(lt, K)
            wts = sigmoid(lt[order])
        elif mt == "phimoe":
            order, wts = [], []
            eps = cfg.get("router_jitter_noise", 0.01)
            masked = lt.copy()
            for _ in range(2):
                top = topk_ids(masked, 1)[0]
                mx = masked[top]
                factor = np.maximum(np.abs(lt), mx)
                drop = ((mx - lt) / factor) > 2 * eps
                gates = np.where(drop | np.isneginf(masked), -np.inf, masked)
                wts.append(softmax(gates)[top])
                order.append(top)
                masked = masked.copy()
                masked[top] = -np.inf
            wts = np.array(wts)
        else:  # DeepSeek
            G, TG = cfg.get("n_group", 1) or 1, cfg.get("topk_group", 1) or 1
            if mt == "deepseek_v3":
                s = sigmoid(lt)
                choice = s + w[p + "mlp.gate.e_score_correction_bias"]
                gs = [np.sort(choice.reshape(G, -1)[g])[-2:].sum() for g in range(G)]
            else:
                s = softmax(lt)
                choice = s.copy()
                gs = [choice.reshape(G, -1)[g].max() for g in range(G)] if cfg.get("topk_method") == "group_limited_greedy" else [0.0]
                if cfg.get("topk_method", "greedy") == "greedy":
                    G = TG = 1
            if G > 1:
                keep = topk_ids(np.array(gs), TG)
                per = E // G
                for g in range(G):
                    if g not in keep:
                        choice[g * per:(g + 1) * per] = 0.0
            order = topk_ids(choice, K)
            wts = s[order]
            if mt == "deepseek_v3":
                if cfg.get("norm_topk_prob"):
                    wts = wts / (wts.sum() + 1e-20)
                wts = wts * cfg.get("routed_scaling_factor", 1.0)
            elif K > 1 and cfg.get("norm_topk_prob"):
                wts = wts / (wts.sum() + 1e-20)
            else:
                wts = wts * cfg.get("routed_scaling_factor", 1.0)
        for e, g in zip(order, wts):
            xt = x[t]
            if mt == "llama4_text":
                gu = (xt * g) @ w[p + "feed_forward.experts.gate_up_proj"][e]
                I = gu.shape[-1] // 2
                out[t] += (gu[I:] * silu(gu[:I])) @ w[p + "feed_forward.experts.down_proj"][e]
            elif mt == "gpt_oss":
                lim = cfg.get("swiglu_limit", 7.0)
                gu = xt @ w[p + "mlp.experts.gate_up_proj"][e] + w[p + "mlp.experts.gate_up_proj_bias"][e]
                gate, up = np.minimum(gu[0::2], lim), np.clip(gu[1::2], -lim, lim)
                glu = gate * sigmoid(gate * 1.702)
                y = ((up + 1) * glu) @ w[p + "mlp.experts.down_proj"][e] + w[p + "mlp.experts.down_proj_bias"][e]
                out[t] += g * y
            else:
                out[t] += g * mlp(xt[None], w, ex.format(e), names)[0]
    if mt == "qwen2_moe" and p + "mlp.shared_expert.gate_proj.weight" in w:
        sh = mlp(x, w, p + "mlp.shared_expert.")
        out = out + sigmoid(x @ w[p + "mlp.shared_expert_gate.weight"].T) * sh
    if mt in ("deepseek_v2", "deepseek_v3") and p + "mlp.shared_experts.gate_proj.weight" in w:
        out = out + mlp(x, w, p + "mlp.shared_experts.")
    if mt == "llama4_text":
        out = out + mlp(x, w, p + "feed_forward.shared_expert.")
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    model_dir, dump = sys.argv[1], sys.argv[2]
    tol = float(sys.argv[sys.argv.index("--tolerance") + 1]) if "--tolerance" in sys.argv else 1e-4
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    if "text_config" in cfg:
        cfg = dict(cfg["text_config"])
    w = load_weights(model_dir)
    rows = [json.loads(line) for line in open(dump)]
    if not rows:
        print("no rows in", dump)
        return 1
    worst, mismatched_top1 = 0.0, 0
    cache = {}
    for r in rows:
        toks = tuple(r["tokens"])
        if toks not in cache:
            cache.clear()
            cache[toks] = forward(cfg, w, list(toks))[-1]
        ref = cache[toks]
        got = np.array(r["logits"], dtype=np.float32)
        err = float(np.max(np.abs(got - ref)) / max(1e-12, float(np.max(np.abs(ref)))))
        worst = max(worst, err)
        if int(np.argmax(got)) != int(np.argmax(ref)):
            mismatched_top1 += 1
    print(f"{cfg['model_type']}: {len(rows)} tokens, worst relative logits error {worst:.2e}, "
          f"top-1 mismatches {mismatched_top1}")
    return 0 if worst <= tol and mismatched_top1 == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
