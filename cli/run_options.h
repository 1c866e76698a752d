/* Every option of `ferry run` and `ferry sim`, once. The parser, the usage text, the canonical
 * configuration (JSON and hash, run_config.c) and the keys of `ferry sweep` are generated from
 * this one table, so they cannot drift apart (they did: --drop-cache and --skip-bad were sweep
 * keys but not in the configuration, and a sweep over them ran once).
 *
 * X(field, name, type, metavar, modes, section, cfg, key, def, lo, hi, check, help, why)
 *   field   the member of struct run_args holding the value, and the sweep key
 *   name    the long option (--name); no abbreviations are accepted
 *   type    FLAG (int: 1 when given), FLAG01 (a FLAG the configuration writes as 0/1, as the
 *           first sweeps did), INT (int64_t in [lo, hi]), SIZE (uint64_t bytes, at least one),
 *           REAL (double in [lo, hi]), TEXT (const char *, borrowed from argv)
 *   metavar what the usage shows after the option ("" for flags)
 *   modes   RUN_M, SIM_M or BOTH_M: the commands that accept it
 *   section the usage heading it is listed under
 *   cfg     CFG_NO: not part of what a run measures (outputs, verbosity), not a sweep key;
 *           CFG_ALWAYS: in the configuration, default included; CFG_GIVEN: in it only when it
 *           differs from the default (options added after the first sweeps, whose hashes stay)
 *   key     its name in the configuration JSON (sorted by it; see run_config.c)
 *   def     default value
 *   lo, hi  bounds of INT and REAL values
 *   check   NULL, or a function that validates a TEXT value and may set what it implies
 *   help    usage text; a '\n' starts a continuation line, indented under the first
 *   why     for a one-command option: why the other command refuses it (may be "") */
#ifndef FERRY_CLI_RUN_OPTIONS_H
#define FERRY_CLI_RUN_OPTIONS_H

#include <stdint.h>

#define FERRY_RUN_OPTIONS(X)                                                                                          \
  /* --- model and workload --- */                                                                                  \
  X(model, "model", TEXT, "NAME|DIR", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "model", NULL, 0, 0, NULL,                   \
    "run: model folder (config.json + safetensors); sim: also a preset name\n(ferry model list), sized from its "    \
    "shapes", "")                                                                                                    \
  X(trace, "trace", TEXT, "FILE", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "trace", NULL, 0, 0, NULL,                       \
    "request trace (Azure CSV, BurstGPT CSV, Mooncake JSONL, ferry JSONL)", "")                                       \
  X(trace_format, "trace-format", TEXT, "F", BOTH_M, SEC_WORKLOAD, CFG_GIVEN, "trace_format", NULL, 0, 0,            \
    check_trace_format, "force the trace format (azure, burstgpt, mooncake, jsonl)", "")                            \
  X(synthetic, "synthetic", TEXT, "SPEC", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "trace", NULL, 0, 0, NULL,               \
    "synthetic arrivals, e.g. rate=2,n=50,prompt=128,output=32", "")                                                 \
  X(max_requests, "max-requests", INT, "N", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "max_requests", 0, 1, INT64_MAX, NULL, \
    "first N requests only", "")                                                                                      \
  X(time_window, "time-window", TEXT, "A:B", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "time_window", NULL, 0, 0,            \
    check_time_window, "requests arriving in [A, B) seconds of the trace (A or B may be empty)", "")                 \
  X(rate_scale, "rate-scale", REAL, "X", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "rate_scale", 1.0, 1e-6, 1e6, NULL,       \
    "replay X times faster (2 = twice the rate)", "")                                                                \
  X(time_scale, "time-scale", REAL, "X", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "time_scale", 1.0, 1e-9, 1e9, NULL,       \
    "multiply arrival times by X", "")                                                                               \
  X(as_fast_as_possible, "as-fast-as-possible", FLAG, "", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "as_fast_as_possible", 0, \
    0, 0, NULL, "every request arrives at the start", "")                                                             \
  X(skip_bad, "skip-bad", FLAG, "", BOTH_M, SEC_WORKLOAD, CFG_GIVEN, "skip_bad", 0, 0, 0, NULL,                      \
    "skip malformed trace rows and requests longer than the model's maximum\nposition (both counted) instead of "    \
    "failing", "")                                                                                                   \
  X(seed, "seed", INT, "S", BOTH_M, SEC_WORKLOAD, CFG_ALWAYS, "seed", 1, 0, INT64_MAX, NULL,                          \
    "token ids and synthetic routing (default 1)", "")                                                               \
  /* --- offload policy --- */                                                                                      \
  X(block_layers, "block-layers", INT, "K", BOTH_M, SEC_POLICY, CFG_ALWAYS, "block_layers", 1, 0, 1 << 20, NULL,     \
    "consecutive layers per streamed block (0 = all; default 1)", "")                                                \
  X(prefetch_depth, "prefetch-depth", INT, "D", BOTH_M, SEC_POLICY, CFG_ALWAYS, "prefetch_depth", 1, 0, 64, NULL,    \
    "blocks in flight ahead of compute (0 = on demand; default 1)", "")                                              \
  X(block_slots, "block-slots", INT, "N", BOTH_M, SEC_POLICY, CFG_GIVEN, "block_slots", 0, 0, 66, NULL,              \
    "device slots the streamed blocks take turns in (default prefetch\ndepth + 1; one more lets a fetch land while " \
    "the block before the\ncomputing one still computes, as PyTorch runtimes' fresh allocations do)", "")          \
  X(pin_first, "pin-first", INT, "N", BOTH_M, SEC_POLICY, CFG_ALWAYS, "pin_first", 0, 0, 1 << 20, NULL,              \
    "keep the first N layers resident", "")                                                                          \
  X(pin_last, "pin-last", INT, "M", BOTH_M, SEC_POLICY, CFG_ALWAYS, "pin_last", 0, 0, 1 << 20, NULL,                 \
    "keep the last M layers resident", "")                                                                           \
  X(resident, "resident", TEXT, "attention|all", BOTH_M, SEC_POLICY, CFG_ALWAYS, "resident", "none", 0, 0,           \
    check_resident, "keep all attention (or everything) resident", "")                                               \
  X(stream_embeddings, "stream-embeddings", FLAG, "", BOTH_M, SEC_POLICY, CFG_GIVEN, "stream_embeddings", 0, 0, 0,  \
    NULL,                                                                                                            \
    "stream the embeddings and the final norm and head like a layer block,\nfetched before the first layer and "  \
    "before the logits every step (a tied\nhead fetches the table again), instead of keeping them on the device:\n" \
    "DeepSpeed ZeRO-3 offloads every parameter above\nstage3_param_persistence_threshold (mark_persistent_parameters)", \
    "")                                                                                                              \
  X(device_budget, "device-budget", SIZE, "SIZE", BOTH_M, SEC_POLICY, CFG_ALWAYS, "device_budget", 0, 0, 0, NULL,    \
    "device memory budget (e.g. 2GiB; default: 90% of the GPU's memory, the\nprofile's in sim, device 0's free "    \
    "memory on cuda; host: unlimited);\nthe default keeps a model that fits resident and fills the rest", "")       \
  X(fill_budget, "fill-budget", FLAG01, "", BOTH_M, SEC_POLICY, CFG_ALWAYS, "fill_budget", 0, 0, 0, NULL,            \
    "dense models, or MoE with experts=cpu: pin the last layers with the\nbudget the working set leaves (on by "    \
    "default when the budget is the\ndefault)", "")                                                                  \
  X(host_budget, "host-budget", SIZE, "SIZE", BOTH_M, SEC_POLICY, CFG_ALWAYS, "host_budget", 0, 0, 0, NULL,          \
    "host memory budget (default: sim 90% of the profile's host memory, run\nhalf of the memory available at "      \
    "start; what does not fit is read from\ndisk)", "")                                                               \
  X(home, "home", TEXT, "disk", BOTH_M, SEC_POLICY, CFG_ALWAYS, "home", "host", 0, 0, check_home,                    \
    "stream every unit from disk (no host copies)", "")                                                              \
  X(keep_cache, "keep-cache", FLAG, "", BOTH_M, SEC_POLICY, CFG_GIVEN, "keep_cache", 0, 0, 0, NULL,                   \
    "buffered disk reads keep their pages: the OS page cache (sim: its model,\nin the host memory the budget "      \
    "leaves) serves a second read (default:\ndrop them)", "")                                                         \
  X(host_memory, "host-memory", TEXT, "M", BOTH_M, SEC_POLICY, CFG_GIVEN, "host_memory", "pinned", 0, 0,              \
    check_host_memory,                                                                                               \
    "pinned (default: page-locked host tier, the link's full rate) or pageable\n(ordinary memory: copies staged by " \
    "the driver, at the profile's pageable\nrate)", "")                                                                  \
  X(expert_cache, "expert-cache", TEXT, "P", BOTH_M, SEC_POLICY, CFG_ALWAYS, "expert_cache", "auto", 0, 0,           \
    check_expert_cache, NULL, "")                                                                                    \
  X(expert_granularity, "expert-granularity", TEXT, "G", BOTH_M, SEC_POLICY, CFG_GIVEN, "expert_granularity",        \
    "expert", 0, 0, check_expert_granularity,                                                                      \
    "expert (default: each expert through the expert cache) or layer (a\nlayer's experts stream with it, all "     \
    "together, as Accelerate and ZeRO-3 do)", "")                                                                    \
  X(offload_compute, "offload-compute", TEXT, "SPEC", BOTH_M, SEC_POLICY, CFG_GIVEN, "offload_compute", NULL, 0, 0,  \
    check_offload_compute,                                                                                         \
    "where what is not on the device is computed: gpu (fetch it, default),\ncpu (on the host's CPU from host "     \
    "memory; only activations cross the\nlink) or auto (per op, fetch when copy + device time < CPU time); one\n"  \
    "for all, or per class: experts=cpu,layers=gpu", "")                                                           \
  X(max_batch, "max-batch", INT, "N", BOTH_M, SEC_POLICY, CFG_ALWAYS, "max_batch", 8, 1, 4096, NULL,                 \
    "concurrent sequences (default 8)", "")                                                                          \
  X(schedule, "schedule", TEXT, "mixed|prefill-first", BOTH_M, SEC_POLICY, CFG_GIVEN, "schedule", "mixed", 0, 0,   \
    check_schedule,                                                                                                \
    "what a step carries: mixed (default: a decode token of every decoding\nsequence, then prompt chunks up to "    \
    "--max-step-tokens) or prefill-first\n(while any admitted prompt has tokens left, steps carry prompts only\n"   \
    "and decoding waits: vLLM without chunked prefill, FlexGen's block\nschedule, a static batch)", "")            \
  X(gpu_batches, "gpu-batches", INT, "N", BOTH_M, SEC_POLICY, CFG_GIVEN, "gpu_batches", 1, 1, 1024, NULL,           \
    "FlexGen's block schedule: N batches of --max-batch sequences go through\neach loaded layer before it is "      \
    "evicted (default 1)", "")                                                                                       \
  X(gpus, "gpus", INT, "N", BOTH_M, SEC_POLICY, CFG_GIVEN, "gpus", 1, 1, 8, NULL,                                    \
    "split the model over N devices (--parallel; host: N budgeted arenas in\none process; sim: N GPUs of the "     \
    "profile and its interconnect);\neach has --device-budget; every weight stays resident", "")                   \
  X(parallel, "parallel", TEXT, "tp|pp|ep", BOTH_M, SEC_POLICY, CFG_GIVEN, "parallel", "none", 0, 0,               \
    check_parallel,                                                                                                  \
    "with --gpus N: tensor parallel (heads and FFN columns split, an all-reduce\nafter attention and after the "     \
    "FFN), pipeline parallel (layer blocks)\nor, for MoE models, expert parallel (experts in ranges per device,\n"   \
    "attention tensor parallel)", "")                                                                                \
  X(expert_placement, "expert-placement", TEXT, "range|hash", BOTH_M, SEC_POLICY, CFG_GIVEN, "expert_placement",      \
    "range", 0, 0, check_expert_placement,                                                                           \
    "--parallel ep: each layer's experts in contiguous ranges per device\n(default) or in the order of a hash of "   \
    "(layer, expert)", "")                                                                                           \
  X(replicas, "replicas", INT, "R", BOTH_M, SEC_POLICY, CFG_GIVEN, "replicas", 1, 1, 64, NULL,                      \
    "data parallel: R copies of the engine (each with --gpus devices, its own\nexecutor and the budgets) serve the " \
    "trace; --router picks one per arriving\nrequest (ferry run: each replica served by its own thread in real "    \
    "time)", "")                                                                                                      \
  X(zero_gpus, "zero-gpus", INT, "N", BOTH_M, SEC_POLICY, CFG_GIVEN, "zero_gpus", 1, 1, 64, NULL,                \
    "ZeRO-3's partitioned layer fetch (ZeRO-Inference on N GPUs): the run is\none of N data-parallel ranks, each "  \
    "with its own batch and link; each\nrank fetches 1/N of every streamed block, the rest arrives from its peers\n" \
    "over the profile's interconnect (sim: needs an interconnect section of\nat least N GPUs; host, cuda: the "      \
    "data copied from host memory)", "")                                                                              \
  X(router, "router", TEXT, "NAME", BOTH_M, SEC_POLICY, CFG_GIVEN, "router", "round-robin", 0, 0, check_router,     \
    "with --replicas: round-robin (default), least-requests (fewest\noutstanding) or least-tokens (fewest tokens "  \
    "left to prefill and generate)", "")                                                                             \
  X(max_step_tokens, "max-step-tokens", INT, "N", BOTH_M, SEC_POLICY, CFG_ALWAYS, "max_step_tokens", 256, 1,         \
    1 << 20, NULL, "tokens per step, decode + prefill chunks (default 256)", "")                                     \
  X(max_seq_tokens, "max-seq-tokens", INT, "N", BOTH_M, SEC_POLICY, CFG_ALWAYS, "max_seq_tokens", 0, 2, 1 << 24,     \
    NULL, "KV capacity per sequence (default: longest request; at most the model's\nmaximum position)", "")         \
  X(kv_dtype, "kv-dtype", TEXT, "F", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_dtype", NULL, 0, 0,             \
    check_kv_dtype,                                                                                                \
    "KV-cache format: fp32, fp16, bf16, or fp8, int8, int4 with a scale per\n32 (default: the model's dtype, as "   \
    "'ferry model show' prints; 'ferry\nmodel kv-error' reports what a format does to the logits)", "")            \
  X(kv_home, "kv-home", TEXT, "device|host|disk|layer", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_home", "device", 0, 0,  \
    check_kv_home,                                                                                                 \
    "where the KV cache lives; host: attention runs on the CPU over it; disk:\nin a file (FlexGen's cache 0 % GPU, " \
    "0 % CPU with --cpu): before each\nlayer's attention on the CPU its sequences' rows are read into host\nmemory " \
    "(--prefetch-depth attentions ahead; --max-batch x\n--max-seq-tokens rows per read in flight, in the host "       \
    "budget), and the\nstep's new rows written back (ferry run: the file is in --disk-dir);\nlayer: each layer's "  \
    "with its weights (llama.cpp -ngl), a streamed\nlayer's in host memory, its window copied up when the layer "    \
    "runs\non the device", "")                                                                                      \
  X(kv_host_memory, "kv-host-memory", TEXT, "M", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_host_memory", NULL, 0, 0,        \
    check_kv_host_memory,                                                                                          \
    "with --kv-home host|layer, the host KV cache's memory: pinned or\npageable (default: --host-memory's; FlexGen "  \
    "pins its weights, not\nits CPU cache)", "")                                                                     \
  X(kv_prefill, "kv-prefill", TEXT, "device|host", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_prefill", "host", 0, 0,        \
    check_kv_prefill,                                                                                              \
    "with --kv-home host, where a prompt's attention runs: host (default, on\nthe CPU like every step) or device "  \
    "(FlexGen, ZeRO-Inference: prompts that\nstart this step attend on the device over a scratch cache of the "     \
    "step's\nK and V, max-batch x max-step-tokens rows in the device budget, then\ntheir K and V go to the host "    \
    "cache; decode tokens and later chunks of a\nprompt, needing the host cache, still attend on the CPU)", "")       \
  X(kv_attention, "kv-attention", TEXT, "device|cpu", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_attention", "cpu", 0, 0,    \
    check_kv_attention,                                                                                            \
    "with --kv-home host, where attention runs: cpu (default, --kv-prefill\nsays where prompts do) or device "     \
    "(FlexGen without --cpu: every token,\nover a scratch into which each layer's cached K and V rows of the "      \
    "step's\nsequences are copied from the host cache, --gpu-batches x max-batch x\nmax-seq-tokens rows in the "    \
    "device budget; the new rows go back to the\nhost cache)", "")                                                 \
  X(kv_block_tokens, "kv-block-tokens", INT, "N", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_block_tokens", 0, 1, 65536,     \
    NULL,                                                                                                          \
    "a paged KV cache: blocks of N tokens given to sequences as they grow;\nadmission by free blocks, the latest "  \
    "sequence preempted when they run\nout; --max-seq-tokens then reserves nothing", "")                          \
  X(kv_preempt, "kv-preempt", TEXT, "M", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_preempt", "recompute", 0, 0,             \
    check_kv_preempt,                                                                                              \
    "recompute (default: a preempted sequence prefills its tokens again) or\nswap (its blocks copied to host "      \
    "memory, within the host budget, and\nback when it is readmitted)", "")                                        \
  X(kv_swap, "kv-swap", SIZE, "SIZE", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_swap", 0, 0, 0, NULL,                       \
    "with --kv-preempt swap: the host bytes for swapped blocks (vLLM's\nswap_space; default: a slot per pool block, "  \
    "within what the host budget\nleaves); a sequence finding too few slots is recomputed", "")                   \
  X(kv_pool, "kv-pool", SIZE, "SIZE", BOTH_M, SEC_POLICY, CFG_GIVEN, "kv_pool", 0, 0, 0, NULL,                       \
    "the paged cache's device bytes (default: a --max-batch x --max-seq-tokens\nreservation's worth when it fits, " \
    "else one sequence's; plus what a\nresident model leaves of the budget)", "")                                  \
  /* --- the executor of `ferry run` --- */                                                                         \
  X(executor, "backend", TEXT, "NAME", RUN_M, SEC_EXECUTOR, CFG_ALWAYS, "executor", "host", 0, 0, check_backend,     \
    NULL, " (the simulator is 'ferry sim')")                                                                          \
  X(threads, "threads", INT, "N", RUN_M, SEC_EXECUTOR, CFG_ALWAYS, "threads", 0, 1, 1024, NULL,                      \
    "BLAS threads of the host executor (default: cores - 2, at least 1)",                                          \
    ": the simulator reads no weights and computes nothing")                                                        \
  X(disk_dir, "disk-dir", TEXT, "DIR", RUN_M, SEC_EXECUTOR, CFG_NO, "disk_dir", NULL, 0, 0, NULL,                     \
    "where the host executor makes its files (--kv-home disk's cache), in a\nprivate folder it removes at the end "  \
    "(default: $TMPDIR, else /tmp)", ": the simulator keeps no files")                                             \
  X(direct_io, "direct-io", FLAG, "", RUN_M, SEC_EXECUTOR, CFG_ALWAYS, "direct_io", 0, 0, 0, NULL,                   \
    "read disk units with O_DIRECT",                                                                               \
    ": the simulator's disk reads already leave nothing in its page cache model unless --keep-cache")               \
  X(drop_cache, "drop-cache", FLAG, "", RUN_M, SEC_EXECUTOR, CFG_GIVEN, "drop_cache", 0, 0, 0, NULL,                 \
    "drop the page cache after each disk read (default on without --direct-io)",                                   \
    ": the simulator's disk reads already leave nothing in its page cache model unless --keep-cache")               \
  X(greedy, "greedy", FLAG, "", RUN_M, SEC_EXECUTOR, CFG_ALWAYS, "greedy", 0, 0, 0, NULL,                            \
    "next token = argmax of the logits (default: seeded draw)",                                                    \
    ": the simulator reads no weights and computes nothing")                                                        \
  X(profile, "profile", FLAG, "", RUN_M, SEC_EXECUTOR, CFG_NO, "profile", 0, 0, 0, NULL,                             \
    "cuda: record the GPU timeline with CUPTI into --db (untraced, with a\nnote in the run, where CUPTI cannot "     \
    "start)", ", with --backend cuda")                                                                                     \
  X(dump_logits, "dump-logits", TEXT, "FILE", RUN_M, SEC_EXECUTOR, CFG_NO, "dump_logits", NULL, 0, 0, NULL,          \
    "write every generated token's input ids and logits as JSONL (a NaN or\ninfinite logit is null, counted in the " \
    "row's \"nonfinite\")", ": a real executor computes logits, the simulator none")                                 \
  X(allow_nonfinite, "allow-nonfinite", FLAG, "", RUN_M, SEC_EXECUTOR, CFG_GIVEN, "allow_nonfinite", 0, 0, 0, NULL,  \
    "run weights holding NaN or Inf (by default they are refused, naming\nthe tensor)",                             \
    " (the simulator reads no weight values)")                                                                       \
  /* --- the hardware of `ferry sim` --- */                                                                         \
  X(hw, "hw", TEXT, "PROFILE", SIM_M, SEC_SIM, CFG_ALWAYS, "hw", NULL, 0, 0, NULL,                                   \
    "hardware profile (ferry hw list) or JSON file; BASE+host=PART+link=PART\n+disk=PART swaps the base's parts, " \
    "BASE+host.memory_bytes=256GiB sets\na figure (ferry hw --help)", "")                                        \
  X(runtime, "runtime", TEXT, "NAME", SIM_M, SEC_SIM, CFG_ALWAYS, "runtime", NULL, 0, 0, NULL,                        \
    "the software issuing the work: eager (PyTorch, one kernel at a time from\nPython), graph (CUDA graphs), native " \
    "(C++ engine), ktransformers (graphs,\nCPU experts), deepspeed-0.7 (eager, ZeRO-3's 2022 parameter path),\n" \
    "ktransformers-v0.3 (AMX experts),\n" \
    "llama.cpp-2024q1 (native; prompts via cuBLAS, MoE rows copied one by one),\n" \
    "llama.cpp-2025q1 (native; CPU k-quant and MoE products by vec_dot),\n" \
    "flexgen (eager; FlexGen's unfused int4), zero-inference-kv (eager; the\nKV-offload fork's CPU attention), " \
    "or a runtime file; default: the\nprofile's, else native", " (a real run's overheads are its own)")  \
  X(quant, "quant", TEXT, "PLAN", SIM_M, SEC_SIM, CFG_ALWAYS, "quant", NULL, 0, 0, check_quant,                      \
    "size a preset's weights in a format or per-class plan (int4-g64, nf4,\nexpert=int3-g64,default=fp16, ...); a " \
    "quantized folder carries its own", "; quantize a model folder with 'ferry model quantize'")                     \
  X(exact, "exact", FLAG, "", SIM_M, SEC_SIM, CFG_NO, "exact", 0, 0, 0, NULL,                                       \
    "every op through the discrete-event simulation (the same figures,\n3-4x slower; by default op times are worked " \
    "out as ops are issued and\nrepeated op sequences replayed, docs/simulator-speed.md)",                           \
    " (a real run is timed by the clock)")                                                                           \
  X(sensitivity, "sensitivity", REAL, "PCT", SIM_M, SEC_SIM, CFG_NO, "sensitivity", 0.0, 0.1, 50.0, NULL,          \
    "after the run, run it once more per rate, time and efficiency of the\nprofile and runtime with that figure PCT % "  \
    "lower, and tabulate how TTFT,\nTPOT, e2e p99 and throughput move and what each figure rests on\n(sourced, "     \
    "fitted, derived, estimate, ferry default): the figures an\nanswer hinges on (docs/hardware-profiles.md)",       \
    ": a real machine's figures are what they are")                                                                  \
  X(jobs, "jobs", INT, "N", SIM_M, SEC_SIM, CFG_NO, "jobs", 0, 1, 256, NULL,                                         \
    "with --sensitivity: simulations in parallel, each in a process of its\nown (default: the cores online)",        \
    ": a real run measures one machine at a time")                                                                   \
  /* --- MoE routing and expert prediction --- */                                                                   \
  X(record_routing, "record-routing", TEXT, "FILE", BOTH_M, SEC_ROUTING, CFG_NO, "record_routing", NULL, 0, 0, NULL, \
    "write every routing decision as JSONL (ferry trace routing reads it)", "")                                      \
  X(record_features, "record-features", TEXT, "V", BOTH_M, SEC_ROUTING, CFG_NO, "record_features", NULL, 0, 0,       \
    check_record_features,                                                                                           \
    "with --record-routing: each token's mlp3 or mlp7 predictor features from\nits embedding and hidden state "     \
    "(ferry predictor train uses them)", "")                                                                         \
  X(predictor, "predictor", TEXT, "V", BOTH_M, SEC_ROUTING, CFG_ALWAYS, "predictor", NULL, 0, 0, check_predictor,    \
    NULL, "")                                                                                                        \
  X(predictor_routing, "predictor-routing", TEXT, "F", BOTH_M, SEC_ROUTING, CFG_ALWAYS, "predictor_routing", NULL,   \
    0, 0, NULL, "routing trace for frequency (popularity) and oracle on real runs", "")                              \
  X(predictor_model, "predictor-model", TEXT, "P", BOTH_M, SEC_ROUTING, CFG_ALWAYS, "predictor_model", NULL, 0, 0,   \
    NULL, "mlp3/mlp7 weights (ferry predictor train), fed each token's features", "")                                \
  X(routing, "routing", TEXT, "FILE", SIM_M, SEC_ROUTING, CFG_ALWAYS, "routing", NULL, 0, 0, NULL,                   \
    "replay a recorded routing trace (what the real run chose)", " (a real run computes its routing)")               \
  X(routing_synth, "routing-synth", TEXT, "SPEC", SIM_M, SEC_ROUTING, CFG_ALWAYS, "routing_synth", NULL, 0, 0, NULL, \
    "synthetic routing, e.g. zipf=1.2,temporal=0.3,layer=0.5,seed=1", " (a real run computes its routing)")         \
  /* --- staying up (cli/run_resil.c, docs/resilience.md) --- */                                                     \
  X(faults, "faults", TEXT, "SPEC", BOTH_M, SEC_RESIL, CFG_GIVEN, "faults", NULL, 0, 0, check_faults,                \
    "inject faults (as FERRY_FAULT): read:eio@N, read:short@N,\nread:eio@N+ (for good), read:delay:MS@P, "           \
    "kernel:fail@N, ...", "")                                                                                        \
  X(io_retries, "io-retries", INT, "N", BOTH_M, SEC_RESIL, CFG_GIVEN, "io_retries", -1, 0, 999, NULL,                 \
    "retries of a failed disk read before it is permanent (default 4), with\nexponential backoff and jitter", "")    \
  X(verify_reads, "verify-reads", FLAG, "", RUN_M, SEC_RESIL, CFG_GIVEN, "verify_reads", 0, 0, 0, NULL,              \
    "checksum every disk read against the first read of the same range",                                           \
    ": the simulator reads no weights and runs in virtual time")                                                     \
  X(pressure, "pressure", FLAG, "", BOTH_M, SEC_RESIL, CFG_GIVEN, "pressure", 0, 0, 0, NULL,                         \
    "memory-pressure control: above the high-water mark degrade in steps\n(prefetch depth, expert cache, on-demand "  \
    "loading, refuse new requests),\nrecover below the low one; the host tier is planned to the low mark", "")       \
  X(pressure_marks, "pressure-marks", TEXT, "H:L", BOTH_M, SEC_RESIL, CFG_GIVEN, "pressure_marks", NULL, 0, 0,      \
    check_pressure_marks, "high- and low-water marks (default 0.85:0.7; implies --pressure)", "")                    \
  X(pressure_os, "pressure-os", FLAG, "", RUN_M, SEC_RESIL, CFG_GIVEN, "pressure_os", 0, 0, 0, NULL,                 \
    "host pressure also from the OS (MemAvailable, PSI /proc/pressure/memory;\nimplies --pressure)",                \
    ": the simulator reads no weights and runs in virtual time")                                                     \
  X(host_budget_schedule, "host-budget-schedule", TEXT, "T:SIZE,...", BOTH_M, SEC_RESIL, CFG_GIVEN,                 \
    "host_budget_schedule", NULL, 0, 0, check_host_budget_schedule,                                                \
    "change the host budget T seconds into serving (implies --pressure)", "")                                       \
  X(reload_at, "reload-at", TEXT, "T:DIR,...", BOTH_M, SEC_RESIL, CFG_GIVEN, "reload_at", NULL, 0, 0, check_reload_at, \
    "swap in the weights of DIR (same architecture; checked against its\nmanifest.sha256) T seconds into serving", "") \
  X(reload_from, "reload-from", TEXT, "DIR", RUN_M, SEC_RESIL, CFG_NO, "reload_from", NULL, 0, 0, NULL,             \
    "SIGHUP swaps in the weights of DIR", ": the simulator reads no weights and runs in virtual time")              \
  X(control_socket, "control-socket", TEXT, "PATH", RUN_M, SEC_RESIL, CFG_NO, "control_socket", NULL, 0, 0, NULL,    \
    "accept 'ferry ctl --socket PATH reload DIR|status' while serving",                                            \
    ": the simulator reads no weights and runs in virtual time")                                                     \
  /* --- output --- */                                                                                              \
  X(plan_only, "plan-only", FLAG, "", BOTH_M, SEC_OUTPUT, CFG_NO, "plan_only", 0, 0, 0, NULL,                        \
    "print the residency plan and exit", "")                                                                         \
  X(db, "db", TEXT, "FILE", BOTH_M, SEC_OUTPUT, CFG_NO, "db", NULL, 0, 0, NULL,                                      \
    "write the run (requests, steps, memory, timeline) to SQLite", "")                                               \
  X(repeat, "repeat", INT, "N", BOTH_M, SEC_OUTPUT, CFG_NO, "repeat", 1, 1, 10000, NULL,                               \
    "run N times, each repetition its own run in --db, tagged with one\nrepeat group ('ferry db diff' compares "     \
    "groups with a statistical test)", "")                                                                           \
  X(repeat_group, "repeat-group", TEXT, "TAG", BOTH_M, SEC_OUTPUT, CFG_NO, "repeat_group", NULL, 0, 0,                \
    check_repeat_group,                                                                                              \
    "the repeat group's tag (default: one made up per invocation); runs of\nseparate invocations with one tag form " \
    "one group (to interleave two\nbuilds)", "")                                                                      \
  X(format, "format", TEXT, "F", BOTH_M, SEC_OUTPUT, CFG_NO, "format", "text", 0, 0, check_format,                     \
    "summary as text (default), json, csv or md (docs/output-formats.md)", "")                                      \
  X(quiet, "quiet", FLAG, "", BOTH_M, SEC_OUTPUT, CFG_NO, "quiet", 0, 0, 0, NULL, "no progress lines", "")          \
  X(help, "help", FLAG, "", BOTH_M, SEC_OUTPUT, CFG_NO, "help", 0, 0, 0, NULL, "this help", "")

/* The C type of each value type. */
#define RUN_CTYPE_FLAG int
#define RUN_CTYPE_FLAG01 int
#define RUN_CTYPE_INT int64_t
#define RUN_CTYPE_SIZE uint64_t
#define RUN_CTYPE_REAL double
#define RUN_CTYPE_TEXT const char *

/* One enumerator per option: RUN_OPT_block_layers, ... */
enum run_opt {
#define RUN_OPT_ENUM_(field, ...) RUN_OPT_##field,
  FERRY_RUN_OPTIONS(RUN_OPT_ENUM_)
#undef RUN_OPT_ENUM_
  RUN_OPT_COUNT
};

/* Where an option is accepted. */
enum { RUN_M = 1, SIM_M = 2, BOTH_M = 3 };
/* Usage headings, in the order printed. */
enum run_section { SEC_WORKLOAD, SEC_POLICY, SEC_EXECUTOR, SEC_SIM, SEC_ROUTING, SEC_RESIL, SEC_OUTPUT, SEC_COUNT };
/* Whether and how an option is part of the canonical configuration. */
enum run_cfg { CFG_NO, CFG_ALWAYS, CFG_GIVEN };
enum run_type { TYPE_FLAG, TYPE_FLAG01, TYPE_INT, TYPE_SIZE, TYPE_REAL, TYPE_TEXT };

/* What the table says about one option (run_options.c builds these from the X-macro). */
struct run_option_info {
  const char *field;   /* sweep key */
  const char *name;    /* long option */
  enum run_type type;
  const char *metavar;
  int modes;
  enum run_section section;
  enum run_cfg cfg;
  const char *key;     /* configuration JSON key */
  const char *help;
  const char *why;
};

/* The row of an option, or NULL past the end. */
const struct run_option_info *run_option(enum run_opt id);
/* The option whose sweep key (field) is `field`, or RUN_OPT_COUNT. */
enum run_opt run_option_by_field(const char *field);

#endif
