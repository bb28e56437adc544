"""Peak memory of the ES update: every leaf's float32 gradient at once vs one group of leaves at a time.

    python benchmarks/update_memory.py [--population 30] [--modes lowrank,full] [--budget-mib 2.44]

A Qwen2-shaped random bf16 model (72.6M parameters: hidden 512, 8 layers, 8 heads / 2 KV heads, MLP 2816,
vocab 32000, untied, q/k/v bias) takes one ES update of N members (SGD, ``Scope('matrices')``). Each row is
built, compiled and run in its own fresh subprocess:

* XLA: the compiled update's own temporary and output buffers (``memory_analysis``), the numbers the
  planner's update lines are checked against (``esjax.plan.memory``, module docstring);
* RSS: the subprocess's peak resident memory (``ru_maxrss``, compilation included) minus a baseline
  subprocess that builds the same parameters and state and runs one tiny jitted op;
* time: the median of two runs of the compiled update after a first one (rows run one after another, so
  state the machine's load beside them).

Rows: ``all leaves`` is ``ESExecution(update_chunk_bytes=None)``, the update as it was (every leaf's float32
gradient alive at once); ``grouped`` is the default budget (256 MiB) scaled by this model's size over
Qwen2.5-7B's, so that, as for 7B, every large leaf is a group of its own. "planned" is
``esjax.plan.plan_memory``'s update scratch for the same model, N and budget (gradient group + noise chunk)
and "planned out" its new θ line.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODEL = dict(vocab_size=32000, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64,
             intermediate_size=2816, qkv_bias=True, tie_word_embeddings=False, model_type="qwen2",
             dtype="bfloat16")
QWEN7B_PARAMS = 7_615_616_512
MiB = 1 << 20


def _config():
    from esjax.model.config import ModelConfig

    return ModelConfig(**MODEL)


def _es_config(mode: str):
    from esjax.es import ESConfig, NoiseSpec, Scope

    return ESConfig(noise=NoiseSpec(seed=0, mode=mode, rank=1, scope=Scope("matrices")), sigma=1e-3,
                    learning_rate=1e-3)


def measure(mode: str, budget: int | None, population: int, run: bool) -> dict:
    """In this process: build θ and the ES state; compile (and, if ``run``, run once) the update."""
    import jax
    import numpy as np

    from esjax.es import ESExecution, init, update
    from esjax.model.params import init_params

    params = init_params(_config(), jax.random.key(0))
    config = _es_config("lowrank" if mode == "baseline" else mode)
    execution = ESExecution(update_chunk_bytes=budget)
    state = init(config, params)
    n = population
    cohort = (np.zeros(n, np.int32), np.arange(n, dtype=np.int32), np.random.default_rng(0).normal(size=n)
              .astype(np.float32))
    out: dict = {"groups": len(execution.update_groups(config, params))}
    if mode == "baseline":
        jax.block_until_ready(jax.jit(lambda x: x + 1)(np.ones(4, np.float32)))
    else:
        stats = update.lower(config, state, *cohort, None, execution).compile().memory_analysis()
        out.update(temp=int(stats.temp_size_in_bytes), output=int(stats.output_size_in_bytes))
        if run:
            times = []
            for _ in range(3):  # the first call includes compilation; the median of the other two is the time
                start = time.perf_counter()
                jax.block_until_ready(update(config, state, *cohort, execution))
                times.append(time.perf_counter() - start)
            out["seconds"] = float(np.median(times[1:]))
    out["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def planned(mode: str, budget: int | None, population: int) -> dict:
    from esjax.plan import plan_memory

    plan = plan_memory(_config(), population=population, mode=mode, update_chunk_bytes=budget, max_lag=0)
    scratch = sum(line.bytes for line in plan.lines if line.name.startswith(("f32 gradient", "noise chunk")))
    return {"scratch": scratch, "new_theta": plan.line("new θ_t+1 (update output)").bytes,
            "params": plan.settings["param_count"]}


def _child(*args: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--population", type=int, default=30)
    p.add_argument("--modes", default="lowrank,full")
    p.add_argument("--budget-mib", type=float, help="grouped rows' update_chunk_bytes (default: 256 MiB scaled)")
    p.add_argument("--no-run", action="store_true", help="compile only (no RSS of a run)")
    p.add_argument("--child", nargs=3, metavar=("MODE", "BUDGET", "RUN"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        mode, budget, run = args.child
        print(json.dumps(measure(mode, None if budget == "none" else int(budget), args.population, run == "1")))
        return

    from esjax.es.grouped import UPDATE_CHUNK_BYTES

    params = planned("lowrank", None, args.population)["params"]
    budget = int(args.budget_mib * MiB) if args.budget_mib else UPDATE_CHUNK_BYTES * params // QWEN7B_PARAMS
    base = _child("baseline", "none", "0")["maxrss"]
    print(f"model: Qwen2-shaped, {params / 1e6:.1f}M parameters, bf16 (float32 θ = {4 * params / MiB:.0f} MiB); "
          f"N = {args.population}; grouped budget {budget / MiB:.2f} MiB; baseline RSS {base / MiB:.0f} MiB")
    print("| mode | update | groups | XLA temp MiB | XLA out MiB | planned scratch MiB | planned out MiB | "
          "temp / planned | extra peak RSS MiB | update s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        for name, b in (("all leaves", None), ("grouped", budget)):
            got = _child(mode, "none" if b is None else str(b), "0" if args.no_run else "1")
            plan = planned(mode, b, args.population)
            rss = "–" if args.no_run else f"{(got['maxrss'] - base) / MiB:.0f}"
            seconds = "–" if args.no_run else f"{got['seconds']:.2f}"
            print(f"| {mode} | {name} | {got['groups']} | {got['temp'] / MiB:.1f} | {got['output'] / MiB:.1f} | "
                  f"{plan['scratch'] / MiB:.1f} | {plan['new_theta'] / MiB:.1f} | {got['temp'] / plan['scratch']:.2f} "
                  f"| {rss} | {seconds} |", flush=True)


if __name__ == "__main__":
    main()
