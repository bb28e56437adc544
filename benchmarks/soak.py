"""Soak: thousands of concurrent WebShop sessions through one env pool for a bounded time.

In-process and loopback-free (no network, no subprocesses): ``--sessions`` sessions share one synthetic
catalog in an :class:`~envs.webshop_bridge.InProcessEnvPool`; every round steps every session once with a mix of
scripted (oracle) and random actions (30% random clickables, 5% junk strings), and a finished session
starts a new goal at once. Every ``--interval`` seconds it samples throughput (env steps/s) and resident
memory (RSS, /proc/self/statm). It stops by itself after ``--minutes`` and reports:

* throughput per interval, its median and the largest deviation from the median (target within ±20%),
  both per wall-clock second and per CPU second of this process: on a shared machine the wall-clock rate
  follows the other jobs' load, the CPU-time rate shows whether the pool itself slows down;
* RSS growth over the last 5 minutes (target < 5%).

Example: ``python benchmarks/soak.py --minutes 10 --sessions 2000 --out benchmarks/soak_result.json``
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from envs.webshop_bridge import InProcessEnvPool, OraclePolicy, synthetic_shop  # noqa: E402
from esjax.rundir.machine import cpu_model


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--products", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds per sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    shop = synthetic_shop(args.products, seed=args.seed)
    train = list(shop.split("train"))
    pool = InProcessEnvPool(shop, args.sessions, seed=args.seed, max_steps=15)
    policies = [OraclePolicy() for _ in range(args.sessions)]

    def new_goal(i: int) -> None:
        goal = rng.choice(train)
        pool.reset_one(i, goal)
        policies[i].reset(goal, shop.goals[goal])

    for i in range(args.sessions):
        new_goal(i)
    gc.collect()
    start = time.perf_counter()
    end = start + 60 * args.minutes
    samples: list[dict] = []
    steps = episodes = interval_steps = 0
    interval_start = start
    cpu_start = time.process_time()
    junk = ["click[nothing]", "search[]", "buy", "click[[", "\x00", "click[< prev]"]
    while True:
        actions = []
        for i, env in enumerate(pool.envs):
            available = env.available_actions()
            roll = rng.random()
            if roll < 0.05:
                action = rng.choice(junk)
            elif roll < 0.35 and available["clickables"]:
                choices = [c for c in available["clickables"] if c.lower() != "buy now"] or available["clickables"]
                action = f"click[{rng.choice(choices)}]"
            else:
                action = policies[i].act(pool._obs[i], available) or "click[back to search]"
            actions.append(action)
        _, _, dones, _ = pool.step(actions)
        steps += len(actions)
        interval_steps += len(actions)
        for i in map(int, dones.nonzero()[0]):
            episodes += 1
            new_goal(i)
        now = time.perf_counter()
        if now - interval_start >= args.interval or now >= end:
            cpu = time.process_time()
            samples.append({"t": round(now - start, 2), "seconds": round(now - interval_start, 2),
                            "steps_per_s": interval_steps / (now - interval_start),
                            "steps_per_cpu_s": interval_steps / max(cpu - cpu_start, 1e-9),
                            "cpu_share": (cpu - cpu_start) / (now - interval_start),
                            "rss_mb": rss_bytes() / 2**20, "episodes": episodes})
            print(f"[soak] t={now - start:7.1f}s  {samples[-1]['steps_per_s']:9.0f} steps/s  "
                  f"{samples[-1]['steps_per_cpu_s']:9.0f} steps/cpu-s  cpu {samples[-1]['cpu_share']:4.0%}  "
                  f"rss {samples[-1]['rss_mb']:8.1f} MiB  episodes {episodes}", flush=True)
            interval_start, interval_steps, cpu_start = now, 0, cpu
            if now >= end:
                break

    # Throughput over full intervals (a short last one is too noisy to judge).
    full = [s for s in samples if s["seconds"] >= args.interval / 2] or samples[-1:]

    def spread(key: str) -> tuple[float, float]:
        rates = [s[key] for s in full]
        median = statistics.median(rates)
        return median, max(abs(r / median - 1) for r in rates)

    median, worst = spread("steps_per_s")
    cpu_median, cpu_worst = spread("steps_per_cpu_s")
    window_start = samples[-1]["t"] - min(300.0, samples[-1]["t"])
    first_in_window = next(s for s in samples if s["t"] >= window_start)
    # The RSS at the start of the last-5-minutes window: the sample closest to (at or before) its start.
    before = [s for s in samples if s["t"] <= window_start] or [first_in_window]
    base = before[-1]["rss_mb"]
    growth = samples[-1]["rss_mb"] / base - 1
    load = os.getloadavg()
    report = {
        "sessions": args.sessions, "products": args.products, "minutes": args.minutes, "interval_s": args.interval,
        "steps": steps, "episodes": episodes, "samples": samples,
        "median_steps_per_s": median, "max_deviation_from_median": worst,
        "median_steps_per_cpu_s": cpu_median, "max_cpu_deviation_from_median": cpu_worst,
        "throughput_cpu_ok": cpu_worst <= 0.20,
        "rss_growth_last_5min": growth, "rss_start_mb": samples[0]["rss_mb"], "rss_end_mb": samples[-1]["rss_mb"],
        "throughput_ok": worst <= 0.20, "memory_ok": growth < 0.05,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "loadavg_end": [round(x, 2) for x in load],
                    "python": sys.version.split()[0], "platform": platform.platform()},
    }
    print(f"[soak] {steps} steps, {episodes} episodes over {args.minutes} min with {args.sessions} sessions; "
          f"median {median:.0f} steps/s, worst interval {worst:+.1%} from the median "
          f"({'ok' if report['throughput_ok'] else 'OUT OF ±20%'}); per CPU second median {cpu_median:.0f}, worst "
          f"{cpu_worst:+.1%} ({'ok' if report['throughput_cpu_ok'] else 'OUT OF ±20%'}); RSS growth, last 5 min "
          f"{growth:+.2%} ({'ok' if report['memory_ok'] else 'OVER 5%'})", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
