"""Engine benchmark on one GPU: MOSS-TD full-size shape with dummy weights, bf16, greedy, fixed output
lengths (EOS and the repetition guard off), audio of the stated length (random noise: content does not
matter for speed; the encoder still runs on it).

Workloads (issue 8):
  w-short  N requests x 12.0 s audio, 60 output tokens, closed loop at concurrency 1, 16, 64;
  w-long   38.0 min (2,280 s) audio, 10,260 output tokens; concurrency 1 (3 requests) and 16 (16 requests);
  w-90     one 90-minute request, 24,300 output tokens.
Also: decode ms/step at batch 1 and ~35K context (wall per engine step, and GPU time of one graph replay),
two transformers baselines on the same weights at that context and batch 1 (the naive eager loop, and a
static KV cache + ``torch.compile(mode="reduce-overhead")``: bench_baselines), and each workload's HBM limit
from the copy bandwidth measured in the same run. Prints one JSON object (also written to ``--out``, after
each stage).

Run on the GPU machine:  python benchmarks/bench_engine.py --out benchmarks/results/engine_h200.json
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_baselines import (
    compiled_transformers_ms_per_token,
    decoder_weight_bytes,
    hbm_limit_s,
    measure_copy_bandwidth,
    naive_transformers_ms_per_token,
)

from engine import Engine, EngineConfig, Sequence
from transcription.moss_td.sequence import build_moss_sequence

WORKLOADS = {  # name: (requests, audio seconds, output tokens, concurrency)
    "w-short-c1": (800, 12.0, 60, 1),
    "w-short-c16": (800, 12.0, 60, 16),
    "w-short-c64": (800, 12.0, 60, 64),
    "w-long-c1": (3, 2280.0, 10_260, 1),
    "w-long-c16": (16, 2280.0, 10_260, 16),
    "w-90": (1, 5400.0, 24_300, 1),
}


def project_steps_s(step_ms: float, wbytes: int, kvb: int, batch: int, prompt: int, measured: int,
                    full: int) -> float:
    """Seconds for decode steps ``measured .. full-1``: the measured median step time (taken at mean
    context ``prompt + measured / 2``) scaled by each step's bytes (weights + KV of ``batch`` rows)."""
    ref = wbytes + batch * (prompt + measured / 2) * kvb
    ctx = prompt + np.arange(measured, full)
    return float(np.sum(step_ms / 1e3 * (wbytes + batch * ctx * kvb) / ref))


def result_header(commit: str) -> dict:
    """The head of every benchmark's JSON: the command line, the commit (the device copy has no git
    history, so it is passed in), the GPU and the torch version."""
    return {"command": " ".join(sys.argv), "commit": commit, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__}


def graph_us(fn: Callable[[], object], reps: int = 50, trials: int = 1) -> float:
    """Microseconds of one replay of a CUDA graph of ``fn``: captured after one eager call on a side stream
    (which compiles and warms up), then the median over ``trials`` of the mean of ``reps`` replays (CUDA
    events). For kernels too short to time one launch at a time: the graph keeps the GPU's launch gaps, not
    the host's."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(times)[len(times) // 2]


def cuda_ms(fn: Callable[[], object], reps: int = 50) -> float:
    """Mean milliseconds per call of ``fn`` on the current stream (CUDA events), after three warm-up calls."""
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def json_saver(res: dict, out: str, markdown: Callable[[dict], str] | None = None,
               md: str = "") -> Callable[[], None]:
    """A function that writes ``res`` to ``out`` (and ``markdown(res)`` to ``md``) when those are set;
    benchmarks call it after each section so a run cut short keeps what it measured."""
    def save() -> None:
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(res, indent=1))
        if md and markdown is not None:
            Path(md).write_text(markdown(res))

    return save


def make_engine(args) -> Engine:
    """The engine as ``diarist engine --device cuda`` builds it (dtype, backend, graphs, async decode and
    kernel choices resolved by :func:`engine.resolve.resolve_config`), MOSS-TD dummy weights, with only the
    choices named on the command line overridden."""
    cfg = EngineConfig(model="moss-td", load_format="dummy", device="cuda", attention_backend=args.backend,
                       cuda_graph_max_bs=args.graph_max_bs, max_running_requests=64, chunk_size=args.chunk_size,
                       async_decode=args.async_decode, kv_memory_fraction=args.kv_fraction, seed=0,
                       kv_dtype=getattr(args, "kv_dtype", "auto"))
    if getattr(args, "no_prefill_graphs", False):
        cfg.prefill_graph_tokens = ()
    if getattr(args, "no_priority_stream", False):
        cfg.priority_stream = False
    if getattr(args, "no_encoder_stream", False):
        cfg.encoder_stream = False
    if getattr(args, "encoder_window_budget", None):
        cfg.encoder_window_budget = args.encoder_window_budget
    if getattr(args, "prefill_buckets", ""):
        cfg.prefill_graph_tokens = tuple(int(t) for t in args.prefill_buckets.split(","))
    if getattr(args, "single_split_per_sm", None) is not None:
        cfg.decode_single_split_programs_per_sm = args.single_split_per_sm
    if getattr(args, "extend_large_tile_from", None) is not None:
        cfg.extend_large_tile_min_tokens = args.extend_large_tile_from
    if getattr(args, "no_fused_decode_gemv", False):
        cfg.fused_decode_gemv = False
    return Engine(cfg)


_serial = iter(range(1, 1 << 40))


def _request(engine: Engine, wave: np.ndarray, out_tokens: int) -> Sequence:
    """A fixed-length request on its own copy of ``wave``, made unique by its first sample so that the
    engine's encoder-output cache and de-duplication never skip the encoder for it."""
    wave = wave.copy()
    wave[0] = next(_serial) * 1e-6
    seq = build_moss_sequence(engine, wave, max_new_tokens=out_tokens)
    seq.ignore_eos = True
    seq.stop_checker = None  # random weights loop; the benchmark wants every token
    return seq


def closed_loop(engine: Engine, requests: int, concurrency: int, make_request: Callable[[int], Sequence],
                step: Callable[[list[Sequence]], bool] | None = None) -> tuple[list[Sequence], float]:
    """Keep ``concurrency`` requests in flight until ``requests`` have finished.

    The clients run on a thread of their own, as the service's API and worker threads do: building a
    request (``make_request(i)``) and ``Engine.submit`` (prompt, waveform hash, pinning: ~1-2 ms per 12 s
    clip, mostly outside the GIL) happen on the caller's thread by design, so they overlap the engine's
    steps. A client submits its next request only after one of its requests has finished (a semaphore of
    ``concurrency``). This thread drives the engine inline through ``step(inflight)`` (default
    ``engine.step()``), which returns whether anything ran, so callers can time each step.

    Returns the finished sequences in finishing order and the client thread's build + submit time (s).
    """
    slots = threading.Semaphore(concurrency)
    submitted: queue.SimpleQueue = queue.SimpleQueue()
    client_s = [0.0]

    def clients() -> None:
        for i in range(requests):
            slots.acquire()
            tc = time.perf_counter()
            seq = make_request(i)
            engine.submit(seq)
            client_s[0] += time.perf_counter() - tc
            submitted.put(seq)

    inflight: list[Sequence] = []
    done: list[Sequence] = []
    client = threading.Thread(target=clients, name="bench-clients", daemon=True)
    client.start()
    while len(done) < requests:
        while not submitted.empty():
            inflight.append(submitted.get_nowait())
        if not (step(inflight) if step is not None else engine.step()):
            time.sleep(50e-6)  # nothing to run: let the client thread have the GIL
        for s in inflight:
            if s.finished:
                done.append(s)
                slots.release()
        inflight = [s for s in inflight if not s.finished]
    client.join()
    return done, client_s[0]


def run_workload(engine: Engine, requests: int, audio_s: float, out_tokens: int, concurrency: int,
                 rng: np.random.Generator) -> tuple[dict, list[Sequence]]:
    """:func:`closed_loop` of fixed-length requests on ``audio_s`` seconds of noise; per-step timings of
    pure decode steps and of decode steps that also carried a prefill chunk."""
    wave = (rng.standard_normal(int(audio_s * 16_000)) * 0.1).astype(np.float32)
    max_stall, pure_steps = [0.0], []

    def timed_step(inflight: list[Sequence]) -> bool:
        mixed = any(not s.prefill_done for s in inflight) and any(s.prefill_done for s in inflight)
        ts = time.perf_counter()
        ran = engine.step()
        dt = time.perf_counter() - ts
        if ran and mixed:  # a decode step that also carried a prefill chunk
            max_stall[0] = max(max_stall[0], dt)
        elif ran and inflight and all(s.prefill_done for s in inflight):
            pure_steps.append(dt)
        return ran

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    done, _ = closed_loop(engine, requests, concurrency, lambda _i: _request(engine, wave, out_tokens), timed_step)
    max_stall = max_stall[0]
    wall = time.perf_counter() - t0
    lat = np.array([s.timings.finished - s.timings.arrival for s in done])
    rtf = lat / audio_s
    out = {
        "requests": requests, "audio_s": audio_s, "output_tokens": out_tokens, "concurrency": concurrency,
        "client_thread": True, "prompt_tokens": done[0].prompt_len, "wall_s": wall, "req_per_s": requests / wall,
        "audio_s_per_s": requests * audio_s / wall,
        "rtf_mean": float(rtf.mean()), "rtf_p50": float(np.percentile(rtf, 50)), "rtf_p95": float(np.percentile(rtf, 95)),
        "latency_mean_s": float(lat.mean()), "latency_p95_s": float(np.percentile(lat, 95)),
        "encoder_s_mean": float(np.mean([s.timings.encoder_s for s in done])),
        "prefill_s_mean": float(np.mean([s.timings.prefill_s for s in done])),
        "decode_s_mean": float(np.mean([s.timings.decode_s for s in done])),
        "worst_mixed_step_s": max_stall,
        "decode_step_ms_p50": float(np.median(pure_steps)) * 1e3 if pure_steps else None,
        "decode_step_ms_last100": float(np.mean(pure_steps[-100:])) * 1e3 if pure_steps else None,
        "truncated": sum(len(s.output_ids) != out_tokens for s in done),
        "finish_reasons": sorted({str(s.finish_reason.value) for s in done}),
    }
    return out, done


def stall_probe(engine: Engine, decodes: int, audio_s: float, rng: np.random.Generator) -> dict:
    """Worst decode stall while a long prompt prefills: ``decodes`` 12 s requests decoding, then one
    ``audio_s`` request arrives; step times of pure-decode steps vs steps that carry a prefill chunk."""
    short = (rng.standard_normal(192_000) * 0.1).astype(np.float32)
    running = [_request(engine, short, 4000) for _ in range(decodes)]
    for s in running:
        engine.submit(s)
    while not all(s.prefill_done for s in running):
        engine.step()
    pure = []
    for _ in range(20):
        ts = time.perf_counter()
        engine.step()
        pure.append(time.perf_counter() - ts)
    long = _request(engine, (rng.standard_normal(int(audio_s * 16_000)) * 0.1).astype(np.float32), 1)
    engine.submit(long)
    mixed, encoding = [], []  # step seconds; whether the long request was still in the encoder stage
    while not long.prefill_done:
        encoding.append(long in engine.encoder.job_of)
        ts = time.perf_counter()
        engine.step()
        mixed.append(time.perf_counter() - ts)
    for s in running + [long]:
        engine.abort(s)
    engine.step()
    return {"decodes": decodes, "long_audio_s": audio_s, "long_prompt_tokens": long.prompt_len,
            "pure_decode_step_ms_p50": float(np.median(pure)) * 1e3,
            "mixed_step_ms_max_excl_encoder": float(np.max(mixed[1:])) * 1e3 if len(mixed) > 1 else None,
            "first_step_ms_incl_encoder": mixed[0] * 1e3, "mixed_steps": len(mixed),
            "worst_step_index": int(np.argmax(mixed[1:])) + 1 if len(mixed) > 1 else None,
            "encoder_stage_steps": int(sum(encoding)),
            "step_ms": [round(t * 1e3, 2) for t in mixed]}


def decode_step_probe(engine: Engine, context: int, steps: int, profile: bool) -> dict:
    """One text-only request with a ``context``-token prompt; time ``steps`` decode steps at batch 1."""
    ids = np.random.default_rng(1).integers(0, 150_000, context).tolist()
    seq = Sequence(prompt_ids=ids, max_new_tokens=steps + 40, ignore_eos=True)
    engine.submit(seq)
    while not seq.prefill_done or len(seq.output_ids) < 8:
        engine.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall_ms = (time.perf_counter() - t0) / steps * 1e3
    out = {"context": context, "steps": steps, "wall_ms_per_step": wall_ms}
    graphs = engine.runner.graphs
    if graphs is not None:  # GPU time of the bucket-1 graph alone (the live row stays in place)
        torch.cuda.synchronize()  # the engine's steps run on their own stream; these replays on this one
        g = graphs.graphs[1][0]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(50):
            g.replay()
        b.record()
        b.synchronize()
        out["gpu_ms_per_step"] = a.elapsed_time(b) / 50
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof

        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(10):
                engine.step()
            torch.cuda.synchronize()
        rows = sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:15]
        out["profile_top_device_us_per_step"] = {e.key[:80]: round(e.device_time_total / 10, 1) for e in rows}
    engine.abort(seq)
    engine.step()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated names")
    ap.add_argument("--requests", default="", help="overrides, e.g. w-short-c1=100,w-long-c1=1")
    ap.add_argument("--tokens", default="", help="output-token overrides (shortened runs are projected)")
    ap.add_argument("--commit", default="", help="commit of the tree (the device copy has no git history)")
    ap.add_argument("--backend", default=None, help="attention backend (default: the engine's choice, triton)")
    ap.add_argument("--graph-max-bs", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=4096)
    ap.add_argument("--no-prefill-graphs", action="store_true", help="prompt chunks run eagerly")
    ap.add_argument("--no-priority-stream", action="store_true", help="steps on the default stream")
    ap.add_argument("--no-encoder-stream", action="store_true", help="the encoder on the steps' stream")
    ap.add_argument("--encoder-window-budget", type=int, default=None, help="EngineConfig.encoder_window_budget")
    ap.add_argument("--prefill-buckets", default="", help="EngineConfig.prefill_graph_tokens, comma-separated")
    ap.add_argument("--single-split-per-sm", type=int, default=None,
                    help="EngineConfig.decode_single_split_programs_per_sm (0: off)")
    ap.add_argument("--extend-large-tile-from", type=int, default=None,
                    help="EngineConfig.extend_large_tile_min_tokens (0: off)")
    ap.add_argument("--no-fused-decode-gemv", action="store_true", help="EngineConfig.fused_decode_gemv=False")
    ap.add_argument("--kv-fraction", type=float, default=0.85)
    ap.add_argument("--kv-dtype", default="auto", help="EngineConfig.kv_dtype: auto (bf16) or fp8_e4m3")
    ap.add_argument("--probe-context", type=int, default=35_000)
    ap.add_argument("--probe-steps", type=int, default=200)
    ap.add_argument("--naive-steps", type=int, default=100, help="0 skips the eager transformers baseline")
    ap.add_argument("--compiled-steps", type=int, default=100,
                    help="0 skips the transformers static cache + torch.compile baseline")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--async-decode", action="store_true", default=None, help="EngineConfig.async_decode=True "
                    "(the engine's default on CUDA)")
    ap.add_argument("--sync-decode", action="store_false", dest="async_decode", help="async_decode=False")
    ap.add_argument("--stall-probe", action="store_true", help="decode stall while a 90-min prompt prefills")
    ap.add_argument("--stall-probe-repeats", type=int, default=1,
                    help="run the stall probe this many times (later runs: one-time costs already paid)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    overrides = dict(kv.split("=") for kv in args.requests.split(",") if kv)
    tok_over = dict(kv.split("=") for kv in args.tokens.split(",") if kv)
    res: dict = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(),
                 "torch": torch.__version__}
    res["commit"] = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                  text=True, check=False).stdout.strip()
    bw = measure_copy_bandwidth()
    t0 = time.perf_counter()
    engine = make_engine(args)
    res["engine_start_s"] = time.perf_counter() - t0
    wbytes = decoder_weight_bytes(engine.model)
    kvb = engine.kv_bytes_per_token
    res.update(copy_bandwidth_tb_s=bw / 1e12, decoder_weight_gb=wbytes / 1e9, kv_bytes_per_token=kvb,
               kv_pool_tokens=engine.allocator.num_slots)
    # No profiler yet: once torch.profiler has run, CUPTI stays attached and slows every later launch
    # (W-short c64 2,363 vs 2,567 audio-s/s on the H200, f690d2e), so the profiled probe runs last.
    res["decode_probe"] = decode_step_probe(engine, args.probe_context, args.probe_steps, False)
    res["decode_probe"]["hbm_limit_ms"] = (wbytes + args.probe_context * kvb) / bw * 1e3
    rng = np.random.default_rng(0)
    run_workload(engine, 4, 12.0, 8, 2, rng)  # warm-up: encoder, mel and prefill kernels
    if args.stall_probe:
        res["stall_probe"] = stall_probe(engine, 16, 5400.0, rng)
        print("stall", json.dumps(res["stall_probe"]), flush=True)
        res["stall_probe_repeats"] = [stall_probe(engine, 16, 5400.0, rng) for _ in range(args.stall_probe_repeats - 1)]
        for r in res["stall_probe_repeats"]:
            print("stall again", json.dumps(r), flush=True)
    res["workloads"] = {}
    for name in [w for w in args.workloads.split(",") if w]:
        n, audio_s, full_tokens, conc = WORKLOADS[name]
        n = int(overrides.get(name, n))
        out_tokens = int(tok_over.get(name, full_tokens))
        torch.cuda.reset_peak_memory_stats()
        stats, _ = run_workload(engine, n, audio_s, out_tokens, conc, rng)
        rounds, batch = (n, 1) if conc == 1 else (-(-n // conc), min(conc, n))
        stats["hbm_limit_s"] = hbm_limit_s(wbytes, kvb, bw, rounds, batch, stats["prompt_tokens"], out_tokens)
        if out_tokens != full_tokens:  # shortened run: project the missing steps (see project_steps_s)
            stats["full_output_tokens"] = full_tokens
            stats["projected_full_wall_s"] = stats["wall_s"] + rounds * project_steps_s(
                stats["decode_step_ms_p50"], wbytes, kvb, batch, stats["prompt_tokens"], out_tokens, full_tokens)
            stats["hbm_limit_full_s"] = hbm_limit_s(wbytes, kvb, bw, rounds, batch, stats["prompt_tokens"],
                                                    full_tokens)
        stats["peak_gpu_mem_gib"] = torch.cuda.max_memory_allocated() / (1 << 30)
        res["workloads"][name] = stats
        print(name, json.dumps(stats), flush=True)
    res["kv_pool_gib"] = kvb * engine.allocator.num_slots / (1 << 30)
    save = json_saver(res, args.out)
    save()
    # The baselines run after every engine measurement (the compiled one leaves Inductor's code and its CUDA
    # graphs' pool in the process), and before the profiler, which must come last of all (above).
    del engine
    torch.cuda.empty_cache()
    failed = transformers_baselines(res, args, make_engine_model_only)
    save()
    if args.profile:  # a fresh engine: the measured one made room for the baselines
        prof = decode_step_probe(make_engine(args), args.probe_context, args.probe_steps, True)
        res["decode_probe"]["profile_top_device_us_per_step"] = prof["profile_top_device_us_per_step"]
    print(json.dumps(res, indent=1))
    save()
    if failed:
        sys.exit(f"bench_engine: baseline(s) failed: {', '.join(failed)} (errors in the result)")


def transformers_baselines(res: dict, args, load: Callable[[], torch.nn.Module]) -> list[str]:
    """The transformers baselines at ``--probe-context``, batch 1, on the weights ``load()`` gives (the
    engine's dummy weights: :func:`make_engine_model_only`), on their device: the naive eager loop
    (``--naive-steps``), then static cache + ``torch.compile`` (``--compiled-steps``; 0 skips either), stored
    as ``res["naive_transformers"]`` / ``res["compiled_transformers"]`` with the W-long c1 decode seconds per
    request they extrapolate to. A baseline that raises is recorded as ``{"error": ...}`` (the engine's
    figures are kept); returns the names of those that did."""
    import traceback

    runs = [(name, fn, steps) for name, fn, steps in (
        ("naive_transformers", naive_transformers_ms_per_token, args.naive_steps),
        ("compiled_transformers", compiled_transformers_ms_per_token, args.compiled_steps)) if steps]
    if not runs:
        return []
    loaded = load()
    device = str(loaded.lm_head.weight.device)
    w_long_tokens = WORKLOADS["w-long-c1"][2]
    failed = []
    for name, fn, steps in runs:
        try:
            out = fn(loaded, args.probe_context, steps, device=device).to_json()
            out["extrapolated_w_long_c1_s_per_request"] = out["ms_per_token"] * w_long_tokens / 1e3
        except Exception as e:  # noqa: BLE001 - recorded in the result, the run goes on
            traceback.print_exc()
            out, failed = {"error": f"{type(e).__name__}: {e}"}, [*failed, name]
        res[name] = out
        print(name, json.dumps(out), flush=True)
    del loaded
    torch._dynamo.reset()  # the compiled decode's code and CUDA-graph pool go before anything else runs
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return failed


def make_engine_model_only() -> torch.nn.Module:
    """The same dummy weights (same seed) without an engine around them."""
    from engine.loaders.moss_td import load_moss_td

    return load_moss_td(EngineConfig(model="moss-td", load_format="dummy", device="cuda", dtype="bfloat16",
                                     seed=0)).model


if __name__ == "__main__":
    main()
