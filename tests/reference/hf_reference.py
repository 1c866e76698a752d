#!/usr/bin/python3
"""Independent numpy re-implementation of the Hugging Face forward pass of the families ferry
computes (Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, OLMoE), written from the transformers
modeling code: RMSNorm in fp32, rotate-half RoPE, grouped-query causal attention (sliding
window for Mistral), SwiGLU, router softmax + top-k (+ renormalisation), shared expert with a
sigmoid gate. Used to check that ferry's logits match the reference within float rounding.

usage: hf_reference.py MODEL_DIR DUMP.jsonl [--tolerance 1e-4]
DUMP.jsonl is written by `ferry run --dump-logits`: one row per generated token with the input
token ids of its sequence and ferry's logits for the last position."""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64}


def load_safetensors(path, out):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
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
    del base


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


def rmsnorm(x, w, eps):
    var = np.mean(x.astype(np.float32) ** 2, axis=-1, keepdims=True)
    return w * (x / np.sqrt(var + eps))


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x, pos, theta):
    # x: [heads, T, d]; HF: inv_freq = 1 / theta^(arange(0, d, 2)/d); emb = cat(freqs, freqs)
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / d))
    freqs = np.outer(pos.astype(np.float32), inv_freq.astype(np.float32))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = np.concatenate([-x2, x1], axis=-1)
    return x * cos + rot * sin


def forward(cfg, w, tokens):
    mt = cfg["model_type"]
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    theta = cfg.get("rope_theta", 10000.0)
    window = cfg.get("sliding_window") if mt == "mistral" else None
    T = len(tokens)
    pos = np.arange(T)
    h = w["model.embed_tokens.weight"][np.array(tokens)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        x = rmsnorm(h, w[p + "input_layernorm.weight"], eps)
        q = x @ w[p + "self_attn.q_proj.weight"].T
        k = x @ w[p + "self_attn.k_proj.weight"].T
        v = x @ w[p + "self_attn.v_proj.weight"].T
        if p + "self_attn.q_proj.bias" in w:
            q = q + w[p + "self_attn.q_proj.bias"]
            k = k + w[p + "self_attn.k_proj.bias"]
            v = v + w[p + "self_attn.v_proj.bias"]
        if mt == "olmoe":
            q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q.reshape(T, nh, hd).transpose(1, 0, 2)
        k = k.reshape(T, nkv, hd).transpose(1, 0, 2)
        v = v.reshape(T, nkv, hd).transpose(1, 0, 2)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        rep = nh // nkv
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        mask = np.tril(np.ones((T, T), dtype=bool))
        if window:
            mask &= np.triu(np.ones((T, T), dtype=bool), -(window - 1))
        s = np.where(mask, s, -np.inf)
        a = softmax(s) @ v
        a = a.transpose(1, 0, 2).reshape(T, nh * hd)
        h = h + a @ w[p + "self_attn.o_proj.weight"].T
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        if mt in ("llama", "mistral", "qwen2"):
            out = (silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[
                p + "mlp.down_proj.weight"
            ].T
        else:
            if mt == "mixtral":
                router, ex = p + "block_sparse_moe.gate.weight", p + "block_sparse_moe.experts.{}."
                names, renorm = ("w1", "w3", "w2"), True
                E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
            else:
                router, ex = p + "mlp.gate.weight", p + "mlp.experts.{}."
                names, renorm = ("gate_proj", "up_proj", "down_proj"), cfg.get("norm_topk_prob", False)
                E, K = cfg["num_experts"], cfg["num_experts_per_tok"]
            probs = softmax(x @ w[router].T)
            out = np.zeros_like(x)
            for t in range(T):
                order = sorted(range(E), key=lambda e: (-probs[t, e], e))[:K]
                wts = probs[t, order]
                if renorm:
                    wts = wts / wts.sum()
                for e, g in zip(order, wts):
                    pe = ex.format(e)
                    y = (silu(x[t] @ w[pe + names[0] + ".weight"].T) * (x[t] @ w[pe + names[1] + ".weight"].T)) @ w[
                        pe + names[2] + ".weight"
                    ].T
                    out[t] += g * y
            if p + "mlp.shared_expert.gate_proj.weight" in w:
                sp = p + "mlp.shared_expert."
                sh = (silu(x @ w[sp + "gate_proj.weight"].T) * (x @ w[sp + "up_proj.weight"].T)) @ w[
                    sp + "down_proj.weight"
                ].T
                gate = 1.0 / (1.0 + np.exp(-(x @ w[p + "mlp.shared_expert_gate.weight"].T)))
                out = out + gate * sh
        h = h + out
    h = rmsnorm(h, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return h @ head.T


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    model_dir, dump = sys.argv[1], sys.argv[2]
    tol = float(sys.argv[sys.argv.index("--tolerance") + 1]) if "--tolerance" in sys.argv else 1e-4
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    w = load_weights(model_dir)
    rows = [json.loads(line) for line in open(dump)]
    if not rows:
        print("no rows in", dump)
        return 1
    worst, mismatched_top1 = 0.0, 0
    cache = {}
    for r in rows:
        toks = tuple(r["tokens"])
        key = (r["req_id"], len(toks))
        if toks not in cache:
            cache.clear()
            cache[toks] = forward(cfg, w, list(toks))[-1]
        ref = cache[toks]
        got = np.array(r["logits"], dtype=np.float32)
        err = float(np.max(np.abs(got - ref)) / max(1e-12, float(np.max(np.abs(ref)))))
        worst = max(worst, err)
        if int(np.argmax(got)) != int(np.argmax(ref)):
            mismatched_top1 += 1
        del key
    print(f"{cfg['model_type']}: {len(rows)} tokens, worst relative logits error {worst:.2e}, "
          f"top-1 mismatches {mismatched_top1}")
    return 0 if worst <= tol and mismatched_top1 == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
