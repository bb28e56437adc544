"""WebShop bridge benchmark: env steps/s, search latency, load time and memory by catalog size.

    python benchmarks/webshop_env.py                      # 1k, 100k and 1M synthetic products
    python benchmarks/webshop_env.py --sizes 1000,100000 --episodes 50

Each catalog size runs in a fresh subprocess (so its load time and resident memory are its own):
it builds a synthetic shop (catalog + goals + BM25 index, no disk cache), then plays a fixed scripted
action mix per goal (search, open the top hit, pick an option, Description / Features sub pages, back,
next page, open a hit, buy). Search is timed on the first 1,000 goals' instructions (``--search-queries``):
``shop.search`` (pruned top-k on catalogs of >= 50k products) against the exact reference path, query by
query, and every pruned top-50 is checked identical to exact BM25's (exit status 1 if any differs).
The 1M run also measures a warm start from the on-disk index cache. Ratios are against the 1k catalog of the same run.
When ../shared/webshop_small is present it also reports the real 1k catalog and the faithfulness
numbers (exact purchases, oracle and random policies over the first 500 goals).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from esjax.rundir.machine import cpu_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _rss_mib() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB, from /proc."""
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, kb, _ = line.split()
                values[key] = int(kb) / 1024
    return values.get("VmRSS:", float("nan")), values.get("VmHWM:", float("nan"))


_BUTTONS = ("back to search", "next >", "< prev")


def _scripted_episode(env, goal_index: int) -> int:
    """The fixed action mix; returns the number of steps taken.

    search, open the top hit, pick its first option, Description, back, Features, back, back to the
    results, Next >, open the top hit of page 2 (else go back and reopen page 1's), Buy Now.
    """
    env.reset(goal_index)
    actions = 0

    def act(action: str) -> list[str]:
        nonlocal actions
        env.step(action)
        actions += 1
        return [c for c in env.available_actions()["clickables"] if c not in _BUTTONS]

    hits = act(f"search[{env.instruction}]")
    if not hits:
        return actions
    options = act(f"click[{hits[0]}]")[4:]  # after description, features, reviews, buy now
    if options:
        act(f"click[{options[0]}]")
    for action in ("click[description]", "click[< prev]", "click[features]", "click[< prev]", "click[< prev]"):
        act(action)
    page2 = act("click[next >]")
    if page2:
        act(f"click[{page2[0]}]")
    else:
        act("click[< prev]")
        act(f"click[{hits[0]}]")
    act("click[buy now]")
    return actions


def _measure(shop, episodes: int, min_seconds: float = 2.0) -> dict:
    from envs.webshop_bridge import WebShopTextEnv

    env = WebShopTextEnv(shop)
    goals = list(range(min(episodes, len(shop.goals))))
    for g in goals[:3]:  # warm caches (rendered products, stemmer)
        _scripted_episode(env, g)
    steps, passes, t0 = 0, 0, time.perf_counter()
    while passes == 0 or time.perf_counter() - t0 < min_seconds:  # small catalogs: repeat for a stable rate
        steps += sum(_scripted_episode(env, g) for g in goals)
        passes += 1
    elapsed = time.perf_counter() - t0
    return {"steps": steps, "steps_per_s": steps / elapsed, "episodes": len(goals) * passes}


def _measure_search(shop, queries: int) -> dict:
    """Median latency of ``shop.search`` (pruned on big catalogs) and of the exact reference path on the
    first ``queries`` goal instructions, timed alternately query by query (so load changes hit both
    alike), and how many top-50 lists are identical (pruned vs exact, whatever ``shop.search`` uses)."""
    engine = shop.engine
    texts = [shop.goals[g].instruction_text.lower() for g in range(min(queries, len(shop.goals)))]
    for q in texts[:20]:  # warm: per-term bounds, the candidate map, page cache of a mapped index
        engine.search_pruned(q)
        engine.search_exact(q)
    wall = {"fast": [], "exact": []}
    cpu = {"fast": [], "exact": []}  # process CPU time: less sensitive to other processes' load
    identical, pruned = 0, 0
    for n, q in enumerate(texts):
        hits = {}
        for name in ("fast", "exact") if n % 2 == 0 else ("exact", "fast"):
            t, c = time.perf_counter(), time.process_time()
            hits[name] = shop.search(q) if name == "fast" else engine.search_exact(q)
            cpu[name].append(time.process_time() - c)
            wall[name].append(time.perf_counter() - t)
        stats = {}
        identical += engine.search_pruned(q, stats=stats) == hits["exact"]
        pruned += stats.get("path") == "pruned"
    return {"search_ms_median": 1000 * statistics.median(wall["fast"]),
            "exact_search_ms_median": 1000 * statistics.median(wall["exact"]),
            "search_cpu_ms_median": 1000 * statistics.median(cpu["fast"]),
            "exact_search_cpu_ms_median": 1000 * statistics.median(cpu["exact"]), "search_queries": len(texts),
            "search_identical_top50": identical, "search_pruned_queries": pruned,
            "search_uses_pruning": bool(engine.pruning),
            "search_bitmaps_mib": engine._pruning_state.dense_nbytes() / 2**20}


def worker(kind: str, size: int, episodes: int, queries: int = 1000) -> dict:
    """Run one configuration in this (fresh) process and return its measurements."""
    rss0, _ = _rss_mib()
    import envs.webshop_bridge as wb
    from envs.webshop_bridge.search import clear_engine_cache

    rss_import, _ = _rss_mib()
    t0 = time.perf_counter()
    if kind == "real":
        shop = wb.load_webshop(os.environ["ESJAX_WEBSHOP_SMALL"], cache_dir=False)
    else:
        shop = wb.synthetic_shop(size, seed=0, cache_dir=False)
    load_s = time.perf_counter() - t0
    rss_loaded, peak = _rss_mib()
    out = {"kind": kind, "size": len(shop.catalog), "goals": len(shop.goals), "load_s": load_s,
           "rss_after_import_mib": rss_import, "rss_loaded_mib": rss_loaded, "peak_rss_mib": peak,
           "catalog_and_index_mib": rss_loaded - rss_import, "interpreter_mib": rss0}
    if kind == "synthetic":  # bytes actually held in arrays (RSS also counts allocator slack)
        held = [shop.engine._data, shop.engine._indices, shop.engine._indptr, shop.goals.goal_product,
                shop.goals.goal_combo, shop.goals.price_upper, *vars(shop.catalog.cols).values()]
        out["arrays_mib"] = sum(a.nbytes for a in held) / 2**20
    if kind == "synthetic" and size >= 1_000_000:
        with tempfile.TemporaryDirectory() as cache:
            clear_engine_cache()
            t = time.perf_counter()
            wb.synthetic_shop(size, seed=0, cache_dir=cache)  # builds and writes the disk cache
            out["cold_with_cache_write_s"] = time.perf_counter() - t
            clear_engine_cache()
            t = time.perf_counter()
            wb.synthetic_shop(size, seed=0, cache_dir=cache)  # index memory-mapped from disk
            out["warm_from_disk_cache_s"] = time.perf_counter() - t
    out.update(_measure(shop, episodes))
    out.update(_measure_search(shop, queries))
    if kind == "real":
        out["faithfulness"] = faithfulness(shop)
    return out


def faithfulness(shop) -> dict:
    """Faithfulness numbers on the first 500 goals of the real small set: exact purchases, oracle, random."""
    from envs.webshop_bridge import OraclePolicy, RandomPolicy, evaluate, exact_purchase_reward

    first = range(min(500, len(shop.goals)))
    exact = [k for k in first if exact_purchase_reward(shop, k) == 1.0]
    oracle, episodes = evaluate(shop, OraclePolicy, first)
    rand, _ = evaluate(shop, lambda: RandomPolicy(0), first)
    return {
        "exact_purchase_1.0": len(exact), "goals": len(first),
        "oracle_on_exact": sum(episodes[k].reward == 1.0 for k in exact) / max(1, len(exact)),
        "oracle_score": oracle.score, "oracle_success": oracle.success_rate, "oracle_steps": oracle.mean_steps,
        "random_score": rand.score, "random_success": rand.success_rate, "random_steps": rand.mean_steps,
    }


def _small_dir() -> Path | None:
    env = os.environ.get("ESJAX_WEBSHOP_SMALL")
    for candidate in ([Path(env)] if env else []) + [REPO.parent / "shared" / "webshop_small"]:
        if (candidate / "products_1000.jsonl").exists():
            return candidate
    return None


def _run(kind: str, size: int, episodes: int, queries: int, env: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--worker", kind, str(size), str(episodes), str(queries)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark worker {kind}:{size} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--search-queries", type=int, default=1000,
                        help="goal instructions to time search on and check pruned == exact top-50 (default 1000)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--worker", nargs=4, metavar=("KIND", "SIZE", "EPISODES", "QUERIES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, size, episodes, queries = args.worker
        print(json.dumps(worker(kind, int(size), int(episodes), int(queries))))
        return 0

    env = dict(os.environ)
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()
    results = [_run("synthetic", s, args.episodes, args.search_queries, env) for s in sizes]
    small = _small_dir()
    if small is not None:
        env["ESJAX_WEBSHOP_SMALL"] = str(small)
        results.append(_run("real", 1000, args.episodes, args.search_queries, env))
    load_after = os.getloadavg()
    base = results[0]
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'catalog':>19} {'goals':>9} {'load s':>8} {'RSS MiB':>8} {'steps/s':>9} {'x 1k':>6} "
          f"{'search ms':>10} {'x 1k':>6}")
    for r in results:
        name = f"{r['kind']} {r['size']:,}"
        print(f"{name:>19} {r['goals']:>9,} {r['load_s']:>8.2f} {r['rss_loaded_mib']:>8.0f} "
              f"{r['steps_per_s']:>9.0f} {r['steps_per_s'] / base['steps_per_s']:>6.2f} "
              f"{r['search_ms_median']:>10.3f} {r['search_ms_median'] / base['search_ms_median']:>6.1f}")
    print(f"{'catalog':>19} {'queries':>8} {'search ms':>10} {'exact ms':>9} {'ratio':>6} {'CPU ms':>7} "
          f"{'exact CPU':>10} {'same top-50':>12}")
    for r in results:
        name = f"{r['kind']} {r['size']:,}"
        how = "pruned" if r["search_uses_pruning"] else "exact"
        print(f"{name:>19} {r['search_queries']:>8,} {r['search_ms_median']:>10.3f} "
              f"{r['exact_search_ms_median']:>9.3f} {r['search_ms_median'] / r['exact_search_ms_median']:>6.2f} "
              f"{r['search_cpu_ms_median']:>7.3f} {r['exact_search_cpu_ms_median']:>10.3f} "
              f"{r['search_identical_top50']:>5,}/{r['search_queries']:<6,} ({how}; pruned path ran on "
              f"{r['search_pruned_queries']:,}; term bitmaps {r['search_bitmaps_mib']:.1f} MiB)")
    for r in results:
        if "warm_from_disk_cache_s" in r:
            print(f"{r['size']:,} products: cold load {r['load_s']:.2f} s, with cache write "
                  f"{r['cold_with_cache_write_s']:.2f} s, warm from disk cache {r['warm_from_disk_cache_s']:.2f} s; "
                  f"RSS {r['rss_loaded_mib']:.0f} MiB ({r['rss_after_import_mib']:.0f} MiB after imports; "
                  f"arrays held {r['arrays_mib']:.0f} MiB), "
                  f"peak {r['peak_rss_mib']:.0f} MiB")
        if "faithfulness" in r:
            f = r["faithfulness"]
            print(f"real small set, first {f['goals']} goals: exact purchase = 1.0 on {f['exact_purchase_1.0']}; "
                  f"oracle 1.0 on {100 * f['oracle_on_exact']:.1f}% of those; oracle score {f['oracle_score']:.1f} / "
                  f"success {100 * f['oracle_success']:.1f}% ({f['oracle_steps']:.1f} steps); random clicking "
                  f"score {f['random_score']:.1f} / success {100 * f['random_success']:.1f}% "
                  f"({f['random_steps']:.1f} steps)")
    if args.json:
        args.json.write_text(json.dumps({"machine": cpu_model(), "load_average": [load_before, load_after],
                                         "results": results}, indent=2))
    if any(r["search_identical_top50"] != r["search_queries"] for r in results):
        print("ERROR: pruned search differs from exact BM25 on some queries", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
