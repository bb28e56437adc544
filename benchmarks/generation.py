"""Generation throughput with per-row ES members, and decode steps wasted on finished rows.

1. **Members vs plain**: the same batch of rows decodes ``--tokens`` tokens through a decode lane
   (:class:`esjax.agent.lanes.Lane`, KV cache, sampling) once with every row its own low-rank rank-1 ES member
   (``x·W + σ·(x·B)·Aᵀ``: one shared base matmul) and once with the plain model. Modes are timed in interleaved
   rounds (order rotated each round, compile excluded) and the ratio is the median of per-round ratios of
   tokens/s, so load from other processes partly cancels out. Goal: ≥ 0.9.
2. **Wasted decode steps**: replies of variable length (drawn from ``--lengths``: a WebShop-like mix of short
   clicks and longer searches) go through one lane of ``--rows`` rows. *Static batching* (every batch runs until
   its longest reply ends, as ``esjax.agent.batch_generate.generate`` does) against *continuous batching* (a row whose
   reply ended takes the next reply at the next tick, as the generate-mode engine does) with 1, 2 and 4 decode
   steps per tick. Wasted share = lane row-steps that produced no kept token / all row-steps computed.

    python benchmarks/generation.py            # ~20M-parameter model, a few minutes on 2 cores
    python benchmarks/generation.py --quick    # tiny smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

from esjax.agent.lanes import Lane, RowState, Sampling, split_seed
from esjax.es.noise import NoiseSpec
from esjax.model.config import ModelConfig
from esjax.model.params import init_params, param_count
from esjax.rundir.machine import cpu_model


def _lane_with_rows(config, params, rows: int, prompt: int, length: int, sampling: Sampling, noise, sigma: float):
    lane = Lane(config, rows, length, params["embed"]["embedding"].dtype, sampling)
    members = [(0, r, noise is not None) for r in range(rows)]
    entries = [(r, list(range(3, 3 + prompt)), RowState(members[r], *split_seed(r), False)) for r in range(rows)]
    lane.prefill(params, noise, sigma, entries, 1)
    return lane


def throughput(config, params, rows: int, prompt: int, tokens: int, rounds: int, steps: int) -> dict:
    """Tokens/s of ``tokens`` decode steps for ``rows`` rows: low-rank r=1 members vs plain."""
    sampling = Sampling(temperature=0.6, top_p=0.95, top_k=50)
    noise = NoiseSpec(seed=0, mode="lowrank", rank=1)
    length = prompt + tokens + 2 * steps + 16
    modes = {"plain": None, "lowrank_r1": noise}

    def run(mode: str) -> float:
        lane = _lane_with_rows(config, params, rows, prompt, length, sampling, modes[mode], 0.01)
        lane.decode(params, modes[mode], 0.01, steps)  # prepares the members' noise
        start = time.perf_counter()
        for _ in range(tokens // steps):
            out = lane.decode(params, modes[mode], 0.01, steps)
        jax.block_until_ready(out)
        return rows * (tokens // steps) * steps / (time.perf_counter() - start)

    for mode in modes:  # compile
        run(mode)
    per_round = {mode: [] for mode in modes}
    names = list(modes)
    for i in range(rounds):
        for mode in names[i % 2:] + names[:i % 2]:
            per_round[mode].append(run(mode))
    ratios = [m / p for m, p in zip(per_round["lowrank_r1"], per_round["plain"])]
    return {"rows": rows, "tokens": tokens, "decode_steps_per_call": steps,
            "plain_tokens_per_s": statistics.median(per_round["plain"]),
            "lowrank_r1_tokens_per_s": statistics.median(per_round["lowrank_r1"]),
            "ratio_median": statistics.median(ratios), "ratios": ratios}


def wasted(config, params, rows: int, replies: list[int], prompt: int, steps: int, continuous: bool) -> dict:
    """Row-steps computed and kept for ``replies`` (their lengths) through one lane of ``rows`` rows."""
    longest = max(replies)
    lane = Lane(config, rows, prompt + 16 + 2 * (longest + steps), params["embed"]["embedding"].dtype, Sampling())
    queue = list(enumerate(replies))
    left: dict[int, int] = {}  # lane row -> tokens still to generate
    computed = kept = 0
    while queue or left:
        if continuous or not left:
            entries = []
            for r in range(rows):
                if r not in left and queue:
                    i, n = queue.pop(0)
                    entries.append((r, list(range(3, 3 + prompt)), RowState((0, 0, False), *split_seed(i), True)))
                    left[r] = n - 1  # the prefill draws the first token
            lane.prefill(params, None, 0.0, entries, steps)
        jax.block_until_ready(lane.decode(params, None, 0.0, steps))  # a real run reads every call
        computed += lane.rows * steps
        for r in list(left):
            take = min(left[r], steps)
            kept += take
            left[r] -= take
            if left[r] <= 0:
                del left[r]
                lane.release(r)
    return {"batching": "continuous" if continuous else "static", "decode_steps_per_tick": steps,
            "row_steps": computed, "kept": kept, "wasted_share": 1 - kept / computed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replies", type=int, default=96, help="replies in the wasted-steps measurement")
    ap.add_argument("--lengths", default="3,5,8,12,20,32", help="reply lengths drawn uniformly")
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 rounds (smoke test)")
    args = ap.parse_args()
    if args.quick:
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate, args.vocab = 64, 2, 4, 2, 128, 256
        args.rounds, args.prompt, args.tokens, args.replies, args.rows = 2, 16, 8, 16, 4
    config = ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                         num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                         intermediate_size=args.intermediate, qkv_bias=True, tie_word_embeddings=True)
    params = init_params(config, jax.random.key(0))
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}; jax {jax.__version__} "
          f"{jax.default_backend()}")
    print(f"model: {param_count(params) / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers, vocab "
          f"{args.vocab}); {args.rows} rows, {args.prompt}-token prompts")
    for steps in (1, 4):
        t = throughput(config, params, args.rows, args.prompt, args.tokens, args.rounds, steps)
        print(f"generation, {steps} decode step(s) per call: plain {t['plain_tokens_per_s']:.0f} tok/s, low-rank r=1 "
              f"members {t['lowrank_r1_tokens_per_s']:.0f} tok/s, ratio {t['ratio_median']:.3f} (rounds: "
              + ", ".join(f"{r:.3f}" for r in t["ratios"]) + ")")
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in args.lengths.split(",")]
    replies = [int(rng.choice(lengths)) for _ in range(args.replies)]
    print(f"wasted decode steps: {len(replies)} replies of {args.lengths} tokens (mean {np.mean(replies):.1f}), "
          f"{args.rows} lane rows")
    for continuous, steps in ((False, 1), (True, 1), (True, 2), (True, 4)):
        w = wasted(config, params, args.rows, replies, args.prompt, steps, continuous)
        print(f"  {w['batching']:>10}, {steps} step(s)/tick: {w['row_steps']} row-steps for {w['kept']} tokens, "
              f"wasted {100 * w['wasted_share']:.1f}%")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
