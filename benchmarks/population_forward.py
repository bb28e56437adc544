"""Population forward throughput: low-rank (rank 1, 4) and full-rank ES members vs the plain batched forward.

Every mode runs the same batch (members × episodes rows) through one jitted forward whose noise is drawn
from the counter-based keys *inside* the program (nothing precomputed), and is reported as a ratio to the
plain unperturbed forward of the same batch. Modes are timed in interleaved rounds (order rotated each
round; each timed call follows an untimed call of the same mode) and the ratio is the median of per-round
ratios, so load from other processes partly cancels out. Several row lengths (``--seq``) are measured in one
run, one after the other. Also: candidate scoring with the prefix KV cache vs naive full-sequence scoring of
the same candidates.

    python benchmarks/population_forward.py            # ~28M-parameter model, 64 and 128 tokens, minutes on 2 cores
    python benchmarks/population_forward.py --seq 32 64 128 512 --modes lowrank-r1 lowrank-r1-all --no-scoring
    python benchmarks/population_forward.py --quick    # tiny smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

from esjax.agent.scoring import score_candidates
from esjax.es.noise import NoiseSpec, Scope
from esjax.model.config import ModelConfig
from esjax.model.decoder import forward_jit
from esjax.model.params import init_params, param_count
from esjax.model.perturb import Perturbation
from esjax.rundir.machine import cpu_model

#: mode name -> (noise mode, rank, scope kind); "plain" is always measured (the baseline). ``matrices``: the
#: kernels and the embedding (tied: the head too); ``all``: also every norm scale and bias (dense deltas, one
#: draw per layer of the stacked ones).
MODES = {"lowrank-r1": ("lowrank", 1, "matrices"), "lowrank-r1-all": ("lowrank", 1, "all"),
         "lowrank-r4": ("lowrank", 4, "matrices"), "full": ("full", 1, "matrices")}


def _time(fn, cpu: list[float] | None = None) -> float:
    """Wall seconds of one call; appends the process CPU seconds (all threads) to ``cpu`` if given."""
    start, start_cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn())
    if cpu is not None:
        cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def _measure(config: ModelConfig, params, modes: dict, rows: int, seq: int, args) -> dict[str, float]:
    """Time every mode on one ``rows x seq`` batch; print the table; return each mode's wall ratio."""
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (rows, seq)).astype(np.int32)
    print(f"\nbatch: {args.members} members x {args.episodes} episodes = {rows} rows x {seq} tokens")
    compile_s = {}
    for name, p in modes.items():
        compile_s[name] = _time(lambda p=p: forward_jit(config, params, tokens, perturbation=p)[0])
    times: dict[str, list[float]] = {name: [] for name in modes}
    cpu: dict[str, list[float]] = {name: [] for name in modes}
    names = list(modes)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order: no mode always first
            p = modes[name]
            call = lambda p=p: forward_jit(config, params, tokens, perturbation=p)[0]
            _time(call)  # untimed: lets the previous mode's buffers (GBs in full mode) drain first
            times[name].append(_time(call, cpu[name]))
    tokens_per_call = rows * seq
    print("ratio = throughput / plain throughput of the same batch. wall, cpu: median over rounds of the"
          " per-round ratio (wall clock; process CPU time, less sensitive to other processes' load);"
          " best: fastest CPU time of plain / fastest of the mode")
    print(f"{'mode':<13}{'rows*tok/s':>12}{'wall':>8}{'cpu':>8}{'best':>8}{'first call s':>14}")
    ratios = {}
    for name in modes:
        wall = [t_plain / t for t_plain, t in zip(times["plain"], times[name])]
        cpu_ratios = [t_plain / t for t_plain, t in zip(cpu["plain"], cpu[name])]
        rate = tokens_per_call / statistics.median(times[name])
        best = min(cpu["plain"]) / min(cpu[name])
        ratios[name] = statistics.median(wall)
        print(f"{name:<13}{rate:>12.0f}{ratios[name]:>8.3f}{statistics.median(cpu_ratios):>8.3f}"
              f"{best:>8.3f}{compile_s[name]:>14.1f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--members", type=int, default=8, help="population members in the batch")
    ap.add_argument("--episodes", type=int, default=2, help="rows per member")
    ap.add_argument("--seq", type=int, nargs="+", default=[64, 128], help="tokens per row (one table each)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), help="modes besides plain")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-scoring", action="store_true", help="skip the candidate-scoring comparison")
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 rounds (smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab = 64, 2, 4, 2, 128, 256
        args.rounds, args.seq = 2, [16]

    config = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                         num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                         intermediate_size=args.intermediate, qkv_bias=True, tie_word_embeddings=True)
    params = init_params(config, jax.random.key(0))
    rows = args.members * args.episodes
    versions = np.full(rows, 3, np.int32)
    indices = np.repeat(np.arange(args.members, dtype=np.int32), args.episodes)
    modes = {"plain": None}
    for name in args.modes:
        mode, rank, scope = MODES[name]
        modes[name] = Perturbation.create(NoiseSpec(seed=0, mode=mode, rank=rank, scope=Scope(scope)), 1e-3,
                                          versions, indices, group_size=args.episodes)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; jax {jax.__version__} on {jax.devices()[0].platform}"
          f"; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"model: {param_count(params) / 1e6:.1f}M params (hidden {args.hidden}, {args.layers} layers, "
          f"vocab {args.vocab}, tied), float32")
    summary = {}
    for seq in args.seq:
        summary[seq] = _measure(config, params, modes, rows, seq, args)
    if "lowrank-r1" in modes and len(args.seq) > 1:
        print("\nlow-rank r=1 / plain (wall, median of per-round ratios): "
              + ", ".join(f"{seq} tokens {ratios['lowrank-r1']:.3f}" for seq, ratios in summary.items()))
    if args.no_scoring:
        return

    # --- prefix-cached vs naive candidate scoring -----------------------------------------------------
    n_prompts, k, prompt_len, cand_len = (4, 4, 24, 4) if args.quick else (8, 8, 120, 6)
    rng = np.random.RandomState(1)
    prompts = [rng.randint(0, config.vocab_size, prompt_len - rng.randint(0, 8)).tolist() for _ in range(n_prompts)]
    cands = [[rng.randint(0, config.vocab_size, rng.randint(1, cand_len + 1)).tolist() for _ in range(k)]
             for _ in range(n_prompts)]
    spert = Perturbation.create(NoiseSpec(seed=0, mode="lowrank", rank=1), 1e-3, np.full(n_prompts, 3),
                                np.arange(n_prompts))
    a = score_candidates(config, params, prompts, cands, spert)
    b = score_candidates(config, params, prompts, cands, spert, prefix_cache=False)
    assert np.allclose(a, b, atol=1e-3), np.abs(a - b).max()
    cached, naive = [], []
    for _ in range(args.rounds):
        cached.append(_time(lambda: score_candidates(config, params, prompts, cands, spert)))
        naive.append(_time(lambda: score_candidates(config, params, prompts, cands, spert, prefix_cache=False)))
    speedup = statistics.median(n / c for n, c in zip(naive, cached))
    print(f"\nscoring {n_prompts} prompts (~{prompt_len} tokens) x {k} candidates (<= {cand_len} tokens), "
          f"low-rank r=1 members, max |cached - naive| = {np.abs(a - b).max():.1e}")
    print(f"prefix-cached {statistics.median(cached) * 1e3:.0f} ms, naive full-sequence "
          f"{statistics.median(naive) * 1e3:.0f} ms: speedup {speedup:.2f}x")


if __name__ == "__main__":
    main()
