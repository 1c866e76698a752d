#!/usr/bin/python3
"""Write a model as a quantized checkpoint in a published layout, and the fp32 model those
packed weights dequantize to, so ferry's reading of the layout can be checked against the
numpy reference. Packing follows each tool's stored format, written here from their
documentation and code, independently of ferry:
  gptq  AutoGPTQ/transformers "gptq" checkpoint format, 4-bit, act-order (desc_act) g_idx:
        qweight int32 [in/8, out], qzeros int32 [groups, out/8] holding zero - 1, fp16 scales
  awq   AutoAWQ GEMM: qweight / qzeros int32 [.., out/8] with nibbles in order 0,2,4,6,1,3,5,7
  ct    compressed-tensors pack-quantized symmetric int4: weight_packed int32 [out, in/8],
        bf16 weight_scale [out, groups], weight_shape
  mxfp4 gpt-oss: fused experts as _blocks uint8 [E, out, in/32, 16], _scales e8m0 [E, out, in/32]
  fp8   DeepSeek-V3: e4m3 weight with fp32 weight_scale_inv per 128 x 128 block

usage: quantize_published.py SRC_DIR FORMAT OUT_DIR REF_DIR"""
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import load_weights  # noqa: E402

GROUP = 32


def write_safetensors(path, tensors):
    """tensors: name -> (safetensors dtype, numpy array)"""
    header, blobs, off = {}, [], 0
    for name, (dt, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_round(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def bf16_bits(x):
    return (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)


def quantizable(name, arr, fmt):
    if fmt == "mxfp4":
        return name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj")
    if arr.ndim != 2 or not name.endswith(".weight") or ".layers." not in name:
        return False
    return not any(s in name for s in ("norm", "router", "mlp.gate.weight", "embed", "shared_expert_gate"))


def pack_rows(q, axis_len):
    """4-bit codes [rows, cols] packed along cols into int32, code j at bits 4j (little end)."""
    rows, cols = q.shape
    out = np.zeros((rows, cols // 8), dtype=np.uint32)
    for j in range(8):
        out |= (q[:, j::8].astype(np.uint32) & 15) << (4 * j)
    return out.view(np.int32)


def asym_groups(wt, groups_of_row):
    """wt [in, out]: per (group, out) min/max scale and zero for 4-bit codes."""
    n_groups = int(groups_of_row.max()) + 1
    scales = np.zeros((n_groups, wt.shape[1]), dtype=np.float16)
    zeros = np.zeros((n_groups, wt.shape[1]), dtype=np.int64)
    for g in range(n_groups):
        rows = wt[groups_of_row == g]
        lo, hi = np.minimum(rows.min(0), 0), np.maximum(rows.max(0), 0)
        s = np.maximum((hi - lo) / 15.0, 1e-8).astype(np.float16)
        scales[g] = s
        zeros[g] = np.clip(np.round(-lo / s.astype(np.float32)), 1, 15)  # gptq v1 cannot hold a zero of 0
    return scales, zeros


def gptq(name, w, rng):
    out_f, in_f = w.shape
    wt = w.T  # [in, out]
    perm = rng.permutation(in_f)  # act order: rows quantized in this order, g_idx follows it
    g_idx = np.empty(in_f, dtype=np.int32)
    g_idx[perm] = np.arange(in_f) // GROUP
    scales, zeros = asym_groups(wt, g_idx)
    s = scales.astype(np.float32)[g_idx]
    z = zeros[g_idx]
    q = np.clip(np.round(wt / s) + z, 0, 15).astype(np.int64)
    deq = (s * (q - z)).T
    qweight = pack_rows(q.T, in_f).T  # pack along in: [in/8, out]
    qzeros = pack_rows(zeros - 1, out_f)
    p = name[: -len(".weight")]
    return {p + ".qweight": ("I32", np.ascontiguousarray(qweight)), p + ".qzeros": ("I32", qzeros),
            p + ".scales": ("F16", scales), p + ".g_idx": ("I32", g_idx)}, deq


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_pack(q):
    """[rows, out] codes -> int32 [rows, out/8], nibble i of a word = column 8c + AWQ_ORDER[i]."""
    rows, n = q.shape
    out = np.zeros((rows, n // 8), dtype=np.uint32)
    for c in range(n // 8):
        for i in range(8):
            out[:, c] |= (q[:, 8 * c + AWQ_ORDER[i]].astype(np.uint32) & 15) << (4 * i)
    return out.view(np.int32)


def awq(name, w, rng):
    out_f, in_f = w.shape
    wt = w.T
    g_of = np.arange(in_f) // GROUP
    scales, zeros = asym_groups(wt, g_of)
    s, z = scales.astype(np.float32)[g_of], zeros[g_of]
    q = np.clip(np.round(wt / s) + z, 0, 15).astype(np.int64)
    deq = ((q - z) * s).T
    p = name[: -len(".weight")]
    return {p + ".qweight": ("I32", awq_pack(q)), p + ".qzeros": ("I32", awq_pack(zeros)),
            p + ".scales": ("F16", scales)}, deq


def ct(name, w, rng):
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // GROUP, GROUP)
    s = bf16_round(np.maximum(np.abs(g).max(-1) / 7.0, 1e-8))
    q = np.clip(np.round(g / s[..., None]), -8, 7).astype(np.int64)
    deq = (q * s[..., None]).reshape(out_f, in_f)
    p = name[: -len(".weight")]
    return {p + ".weight_packed": ("I32", pack_rows((q + 8).reshape(out_f, in_f), in_f)),
            p + ".weight_scale": ("BF16", bf16_bits(s)),
            p + ".weight_shape": ("I64", np.array([out_f, in_f], dtype=np.int64))}, deq


FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def mxfp4_matrix(m):
    """m [out, in] -> blocks [out, in/32, 16] uint8, scales [out, in/32] uint8, dequantized."""
    out_f, in_f = m.shape
    b = m.reshape(out_f, in_f // 32, 32)
    amax = np.maximum(np.abs(b).max(-1), 1e-30)
    exp = np.floor(np.log2(amax)).astype(np.int64) - 2  # largest e2m1 is 6 = 1.5 * 2^2
    scale = np.ldexp(1.0, exp).astype(np.float32)
    v = b / scale[..., None]
    codes = np.abs(v[..., None] - FP4[None, None, None, :]).argmin(-1).astype(np.uint8)
    deq = FP4[codes] * scale[..., None]
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exp + 127).astype(np.uint8), deq.reshape(out_f, in_f)


def mxfp4(name, w, rng):
    """w: fused bf16 layout [E, in, out]; the checkpoint stores [E, out, in/32, 16]."""
    blocks, scales, deq = [], [], []
    for e in range(w.shape[0]):
        bl, sc, dq = mxfp4_matrix(w[e].T)
        blocks.append(bl)
        scales.append(sc)
        deq.append(dq.T)
    return {name + "_blocks": ("U8", np.stack(blocks)), name + "_scales": ("U8", np.stack(scales))}, np.stack(deq)


def e4m3_table():
    vals = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = math.nan if (e == 15 and m == 7) else (m / 8 * 2 ** -6 if e == 0 else (1 + m / 8) * 2 ** (e - 7))
        vals[b] = -v if s else v
    return vals


E4M3 = e4m3_table()
E4M3_FINITE = np.where(np.isnan(E4M3), np.inf, E4M3)


def fp8(name, w, rng):
    out_f, in_f = w.shape
    bo, bi = (out_f + 127) // 128, (in_f + 127) // 128
    sinv = np.zeros((bo, bi), dtype=np.float32)
    codes = np.zeros((out_f, in_f), dtype=np.uint8)
    deq = np.zeros_like(w)
    for a in range(bo):
        for b in range(bi):
            blk = w[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128]
            s = np.float32(max(np.abs(blk).max(), 1e-12) / 448.0)
            c = np.abs((blk / s)[..., None] - E4M3_FINITE[None, None, :]).argmin(-1).astype(np.uint8)
            sinv[a, b] = s
            codes[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128] = c
            deq[a * 128:(a + 1) * 128, b * 128:(b + 1) * 128] = (E4M3[c] * s).astype(np.float32)
    return {name: ("F8_E4M3", codes), name + "_scale_inv": ("F32", sinv)}, deq


QCONFIG = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": False,
             "checkpoint_format": "gptq"},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
    "ct": {"quant_method": "compressed-tensors", "format": "pack-quantized",
           "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                         "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                     "group_size": GROUP, "strategy": "group"}}},
           "ignore": ["lm_head"]},
    "mxfp4": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                                                  "model.layers.*.mlp.router",
                                                                  "model.embed_tokens", "lm_head"]},
    "fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
}


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    src, fmt, out_dir, ref_dir = sys.argv[1:]
    cfg = json.load(open(os.path.join(src, "config.json")))
    w = load_weights(src)
    rng = np.random.default_rng(11)
    packed, ref = {}, {}
    fn = {"gptq": gptq, "awq": awq, "ct": ct, "mxfp4": mxfp4, "fp8": fp8}[fmt]
    n_q = 0
    for name, arr in w.items():
        if quantizable(name, arr, fmt):
            parts, deq = fn(name, arr, rng)
            packed.update(parts)
            ref[name] = ("F32", deq.astype(np.float32))
            n_q += 1
        else:
            packed[name] = ("F32", arr)
            ref[name] = ("F32", arr)
    for d, tensors, c in ((out_dir, packed, dict(cfg, quantization_config=QCONFIG[fmt])), (ref_dir, ref, cfg)):
        os.makedirs(d, exist_ok=True)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=2)
    print(f"{fmt}: {n_q} tensors packed")
    return 0 if n_q else 1


if __name__ == "__main__":
    sys.exit(main())
