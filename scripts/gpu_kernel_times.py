#!/usr/bin/env python3
"""Measure a GPU's fp16 GEMM times and host<->device copy rates with PyTorch, for checking
`ferry hw kernel` on a GPU ferry's cost model was not developed against
(scripts/validate-published.sh --kernel-set h200).

  usage: python3 scripts/gpu_kernel_times.py GPU_NAME OUT_DIR [--seconds S]

Writes OUT_DIR/mlp_GPU.csv in the long format of
../shared/validation/gpu-kernels-a100/mlp_a100.csv (Vidur's columns: one row per model, tensor
parallel degree, token count and op; times in ms to 0.1 us) and OUT_DIR/copies_GPU.txt.

What is timed, and how:
- The four linear layers of a transformer block as Vidur's profiler times them (attn_pre_proj:
  the fused QKV projection; attn_post_proj: the output projection; mlp_up_proj: gate and up
  fused where the MLP is gated; mlp_down_proj), for the A100 set's models, tp in {1, 2, 4, 8}
  (the weights' shard) and token counts 1 to 4096: torch.nn.functional.linear in fp16, which is
  cuBLAS, as vLLM's layers call it.
- Each shape is captured in a CUDA graph of REPEATS back-to-back products, so no launch or
  Python time is counted (a kernel's own time, as a profiler reports it). The products rotate
  over enough copies of the weight to fill twice the L2 cache, so each reads its weight from
  memory, as a model's successive layers do; Vidur's profiler reuses one weight, which on small
  shards may be served from L2.
- median/min/max are over the graph's replays, each replay's mean per product.
- The element-wise ops (norms, rotary embedding, activation) are vLLM's own CUDA kernels, which
  PyTorch does not have, so they are not timed: eager PyTorch would time other kernels.
- Copies: 512 MiB host->device and device->host from pinned and from pageable memory, best of 5.

Stops after --seconds (default 150), keeping every row written so far (the file is flushed per
shape).
"""
import argparse
import os
import sys
import time

import torch

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 1536, 2048, 3072, 4096)
# model, n_embd, n_expanded_embd, n_head, n_kv_head, use_gated_mlp, tp degrees: the A100 set's
MODELS = (
    ("Llama-2-7b-hf", 4096, 11008, 32, 32, True, (1, 2, 4, 8)),
    ("Meta-Llama-3-8B", 4096, 14336, 32, 8, True, (1, 2, 4, 8)),
    ("phi-2", 2560, 10240, 32, 32, False, (1,)),
    ("internlm-20b", 5120, 13824, 40, 40, True, (1, 2, 4, 8)),
    ("CodeLlama-34b-Instruct-hf", 8192, 22016, 64, 8, True, (1, 2, 4, 8)),
    ("Llama-2-70b-hf", 8192, 28672, 64, 8, True, (1, 2, 4, 8)),
    ("Meta-Llama-3-70B", 8192, 28672, 64, 8, True, (1, 2, 4, 8)),
    ("Qwen-72B", 8192, 24576, 64, 64, True, (1, 2, 4, 8)),
)
REPEATS = 10   # products per graph, at least (more where the weight's copies need more)
REPLAYS = 5    # timed replays per shape


def l2_bytes():
    props = torch.cuda.get_device_properties(0)
    return getattr(props, "L2_cache_size", 0) or 64 << 20


def time_linear(m, n, k, copies_min_bytes):
    """ms per product of x[m, k] by W[n, k]^T (fp16): median, min, max over the replays."""
    wbytes = n * k * 2
    copies = max(2, min(64, -(-copies_min_bytes // wbytes)))
    repeats = max(REPEATS, copies)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02 for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph: cuBLAS picks and loads its kernel
        for i in range(3):
            torch.nn.functional.linear(x, ws[i % copies])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(repeats):
            torch.nn.functional.linear(x, ws[i % copies])
    graph.replay()
    torch.cuda.synchronize()
    per = []
    for _ in range(REPLAYS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / repeats)
    del graph, ws, x
    per.sort()
    return per[len(per) // 2], per[0], per[-1]


def copies(path, gpu):
    size = 512 << 20
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    lines = []
    for pinned in (True, False):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        host.fill_(1)
        for direction in ("h2d", "d2h"):
            best = None
            for _ in range(6):  # the first is a warm-up (pageable: the driver's staging buffers)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if direction == "h2d":
                    dev.copy_(host, non_blocking=pinned)
                else:
                    host.copy_(dev, non_blocking=pinned)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                best = dt if best is None or dt < best else best
            lines.append("%s %s %s: %.2f GB/s (512 MiB, best of 5 after a warm-up)"
                         % (gpu, "pinned" if pinned else "pageable", direction, size / best / 1e9))
        del host
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gpu")
    ap.add_argument("out_dir")
    ap.add_argument("--seconds", type=float, default=150)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_kernel_times.py: no CUDA device")
    os.makedirs(a.out_dir, exist_ok=True)
    start = time.time()
    print("device: %s, L2 %d MiB, torch %s" % (torch.cuda.get_device_name(0), l2_bytes() >> 20, torch.__version__),
          flush=True)
    copies(os.path.join(a.out_dir, "copies_%s.txt" % a.gpu), a.gpu)
    rotate = 2 * l2_bytes()
    path = os.path.join(a.out_dir, "mlp_%s.csv" % a.gpu)
    rows = 0
    with open(path, "w") as f:
        f.write("gpu,model,n_embd,n_expanded_embd,n_head,n_kv_head,use_gated_mlp,tp,num_tokens,op,"
                "time_ms_median,time_ms_min,time_ms_max\n")
        for model, e, ff, h, kv, gated, tps in MODELS:
            hd = e // h
            for tp in tps:
                ops = (("attn_pre_proj", (h + 2 * kv) * hd // tp, e), ("attn_post_proj", e, h * hd // tp),
                       ("mlp_up_proj", (2 if gated else 1) * ff // tp, e), ("mlp_down_proj", e, ff // tp))
                for t in TOKENS:
                    if time.time() - start > a.seconds:
                        print("gpu_kernel_times.py: --seconds %g spent after %d rows" % (a.seconds, rows), flush=True)
                        return
                    for op, n, k in ops:
                        med, lo, hi = time_linear(t, n, k, rotate)
                        f.write("%s,%s,%d,%d,%d,%d,%s,%d,%d,%s,%.4f,%.4f,%.4f\n"
                                % (a.gpu, model, e, ff, h, kv, gated, tp, t, op, med, lo, hi))
                        rows += 1
                    f.flush()
            print("[%5.1fs] %s done (%d rows)" % (time.time() - start, model, rows), flush=True)
    print("gpu_kernel_times.py: %d rows in %s (%.1f s)" % (rows, path, time.time() - start), flush=True)


if __name__ == "__main__":
    main()
