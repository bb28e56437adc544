"""Prefill and decode tokens/s on SmolLM2-135M-Instruct's real weights: esjax against transformers (issue 58, item 5).

Both sides load the same HF folder (``python -m esjax.convert --out models/smollm2-135m-instruct``) in float32 and
run the same batch: ``--rows`` copies of a real chat-templated WebShop prompt (a results page after a search,
:data:`experiments.smollm2_parity.PROMPTS`, truncated or repeated to ``--prompt`` tokens), then ``--tokens`` greedy
decode steps from the prompt's KV cache.

- **esjax**: a decode lane (:class:`esjax.agent.lanes.Lane`, what generate mode runs): one prefill of all rows,
  then ``decode`` calls of 1 and of 4 steps each (the generate config's ``decode_steps``), plain and with every
  row its own rank-1 ES member inside the matmuls (what an ES run decodes).
- **transformers**: ``AutoModelForCausalLM`` on PyTorch (CPU, as many threads as cores): one forward of the batch
  with ``use_cache=True``, then one forward per token with the returned cache, under ``torch.inference_mode``.

Modes are timed in interleaved rounds (order rotated, compile and warm-up excluded); each figure is the median over
rounds and each ratio the median of per-round ratios, so load from other processes partly cancels. Time it alone.

    python benchmarks/smollm2_speed.py --model models/smollm2-135m-instruct            # ~5 min on 2 cores
    python benchmarks/smollm2_speed.py --model models/smollm2-135m-instruct --quick    # 4 rows, 1 round
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from esjax.agent.lanes import Lane, RowState, Sampling, split_seed  # noqa: E402
from esjax.es.noise import NoiseSpec  # noqa: E402
from esjax.model.hf import load_pretrained  # noqa: E402
from esjax.rundir.machine import cpu_model  # noqa: E402


def batch_ids(pre, rows: int, prompt: int) -> list[list[int]]:
    """``rows`` copies of the WebShop results-page prompt, cut or repeated to exactly ``prompt`` tokens."""
    from experiments.smollm2_parity import prompt_texts

    ids = pre.tokenizer.encode(prompt_texts(pre)[1]).ids
    ids = (ids * (prompt // len(ids) + 1))[-prompt:]
    return [list(ids) for _ in range(rows)]


class EsjaxSide:
    """esjax's lane: prefill every row, then decode ``tokens`` steps, ``steps`` per call."""

    def __init__(self, pre, ids: list[list[int]], tokens: int, members: bool):
        self.pre, self.ids, self.tokens = pre, ids, tokens
        self.noise = NoiseSpec(seed=0, mode="lowrank", rank=1) if members else None
        self.sigma = 1e-3 if members else 0.0

    def run(self, steps: int) -> tuple[float, float]:
        """(prefill seconds, decode seconds) of one pass."""
        params, rows = self.pre.params, len(self.ids)
        lane = Lane(self.pre.config, rows, len(self.ids[0]) + self.tokens + 2 * steps + 64,
                    params["embed"]["embedding"].dtype, Sampling())
        entries = [(r, self.ids[r], RowState((0, r, self.noise is not None), *split_seed(r), True))
                   for r in range(rows)]
        start = time.perf_counter()
        jax.block_until_ready(lane.prefill(params, self.noise, self.sigma, entries, steps))
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(self.tokens // steps):
            out = lane.decode(params, self.noise, self.sigma, steps)
            np.asarray(out)  # the engine reads every call's tokens
        return prefill, time.perf_counter() - start


class TransformersSide:
    """transformers' model: one cached forward of the batch, then one forward per greedy token."""

    def __init__(self, folder: Path, ids: list[list[int]], tokens: int):
        import torch
        import transformers

        torch.set_num_threads(os.cpu_count() or 1)
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.ids, self.tokens = torch.tensor(ids), tokens
        forward = inspect.signature(self.model.forward).parameters
        self.cache_arg = "cache" if "cache" in forward else "past_key_values"  # renamed in transformers 5.x

    def run(self, steps: int = 1) -> tuple[float, float]:
        """(prefill seconds, decode seconds) of one pass; one token per forward (``steps`` is esjax's)."""
        torch = self.torch
        with torch.inference_mode():
            start = time.perf_counter()
            out = self.model(self.ids, use_cache=True, logits_to_keep=1)  # as generate(): last position's logits
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(self.tokens):
                out = self.model(nxt, use_cache=True, logits_to_keep=1, **{self.cache_arg: _cache(out)})
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            return prefill, time.perf_counter() - start


def _cache(out):
    """The KV cache a forward returned (``cache`` in newer transformers, ``past_key_values`` before)."""
    return out.cache if hasattr(out, "cache") else out.past_key_values


def measure(sides: dict, rows: int, prompt: int, tokens: int, rounds: int) -> dict:
    """Per mode, the median tokens/s over interleaved rounds and the median of its per-round ratios against
    transformers, for prefill and for decode."""
    modes = {"transformers": (sides["transformers"], 1), "esjax (1 step/call)": (sides["esjax"], 1),
             "esjax (4 steps/call)": (sides["esjax"], 4),
             "esjax rank-1 members (4 steps/call)": (sides["esjax members"], 4)}
    for side, steps in modes.values():  # compile, warm caches
        side.run(steps)
    per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    names = list(modes)
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            side, steps = modes[name]
            per_round[name].append(side.run(steps))
    out = {}
    for name, runs in per_round.items():
        steps = modes[name][1]
        decoded = rows * (tokens // steps) * steps  # tokens a pass decodes
        out[name] = {"prefill_tokens_per_s": [rows * prompt / p for p, _ in runs],
                     "decode_tokens_per_s": [decoded / d for _, d in runs]}
    ref = out["transformers"]
    return {name: {kind: {"median": statistics.median(figures[kind]),
                          "ratio_vs_transformers": statistics.median(a / b for a, b in zip(figures[kind], ref[kind]))}
                   for kind in ("prefill_tokens_per_s", "decode_tokens_per_s")}
            for name, figures in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"))
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--quick", action="store_true", help="4 rows, 64-token prompts, 8 tokens, 1 round (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.prompt, args.tokens, args.rounds = 4, 64, 8, 1
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no config.json; write the folder with `python -m esjax.convert --out "
                         "models/smollm2-135m-instruct` (README, 'A real LLM on the CPU')")
    load = os.getloadavg()[0]
    pre = load_pretrained(args.model, dtype=np.float32)
    ids = batch_ids(pre, args.rows, args.prompt)
    sides = {"esjax": EsjaxSide(pre, ids, args.tokens, members=False),
             "esjax members": EsjaxSide(pre, ids, args.tokens, members=True),
             "transformers": TransformersSide(args.model, ids, args.tokens)}
    import torch
    import transformers

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; load {load:.2f}; jax {jax.__version__} "
          f"{jax.default_backend()}; torch {torch.__version__} ({torch.get_num_threads()} threads); transformers "
          f"{transformers.__version__}")
    print(f"SmolLM2-135M-Instruct float32; {args.rows} rows x {args.prompt}-token prompts, {args.tokens} greedy "
          f"tokens; {args.rounds} rounds")
    summary = measure(sides, args.rows, args.prompt, args.tokens, args.rounds)
    for name, figures in summary.items():
        p, d = figures["prefill_tokens_per_s"], figures["decode_tokens_per_s"]
        print(f"{name:>36}: prefill {p['median']:7.0f} tok/s (x{p['ratio_vs_transformers']:.2f}), "
              f"decode {d['median']:6.0f} tok/s (x{d['ratio_vs_transformers']:.2f} vs transformers)")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_model(), "load_before": load, "rows": args.rows,
                                         "prompt": args.prompt, "tokens": args.tokens, "rounds": args.rounds,
                                         "figures": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
