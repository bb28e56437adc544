"""Test-session settings shared by every test (and inherited by the subprocesses tests start), and the
helpers several test files share: child-process environments (simulated CPU devices included), a runner
for child Python processes, and free local ports.

The tests live in one folder per package they test (``tests/es/``, ``tests/train/``, ``tests/webshop_bridge/``, …;
file names stay unique across folders). Helper modules beside this file are importable from every test:
``run_settings`` (the run settings training tests share), ``webshop_fixtures``, ``ray_fixtures`` and ``reliability``.

The multi-device harness: JAX fixes its device count when it starts, so a test that needs a mesh of ``n``
simulated CPU devices runs its script in a child process started by :func:`run_python` with
``devices=n`` (``XLA_FLAGS=--xla_force_host_platform_device_count=n``); the fixtures below hand these
helpers to tests (session-scoped: they hold no state).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from crash_rerun import pytest_terminal_summary, pytest_xdist_make_scheduler  # noqa: F401 (hooks)

REPO = Path(__file__).resolve().parents[1]

# A persistent XLA compilation cache shared by the test processes (the pytest-xdist workers) and the child processes
# tests start: the suite compiles the same small programs in many processes (workers, CLI runs, simulated-device
# meshes), and a program compiled once is loaded from disk everywhere else. Workers used to run without it (6 Dec
# 2026, jax 0.10.2: a worker aborted once inside XLA loading a cached executable, and a dead worker hung the run);
# since a crashed test runs again in a fresh worker (crash_rerun.py) and nothing hangs, the cache is on for workers
# too (issue 59: measured in README's Development section). ``ESJAX_TEST_XLA_CACHE=off`` turns it off for the
# workers.
_CACHE = Path(os.environ.get("ESJAX_TEST_XLA_CACHE", Path(tempfile.gettempdir()) / "esjax-test-xla-cache"))
_CACHE_SETTINGS = {
    "JAX_COMPILATION_CACHE_DIR": str(_CACHE),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.2",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
for _key, _value in _CACHE_SETTINGS.items():
    os.environ.setdefault(_key, _value)  # the folder stays set so an in-process run never picks ~/.cache/esjax/xla
if os.environ.get("ESJAX_TEST_XLA_CACHE") == "off":
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # this process only: subprocess_env passes no other JAX_*

#: XLA CPU flags that roughly halve compile time of the multi-device scripts (results unchanged there).
FAST_XLA = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

#: Test modules that take longest on a 2-core CPU (``--durations=0``, summed per file), longest first. With
#: ``-n auto --dist loadscope`` every module goes to one worker, and xdist hands out the modules with the most tests
#: first, so these (one to a dozen tests each, up to a minute) would start last and the suite would end on one busy
#: worker. They start first instead (longest processing time first); the rest follow in xdist's order. A stale list
#: only costs time.
HEAVY_FIRST = ("test_trainer_multiprocess", "test_trainer", "test_generate_mode", "test_trainer_resume",
               "test_accelerator_benchmark", "test_trainer_envpools", "test_trainer_mesh", "test_reliability_storage",
               "test_scale_runs", "test_es_update", "test_envpool_failures", "test_default_policy",
               "test_reliability_env", "test_config", "test_scale_units", "test_trainer_failures", "test_es_evosax",
               "test_trainer_extend")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core on a fresh machine, 1.5 once the compilation cache holds programs. Cold, the
    suite is XLA compiles (CPU-bound); warm, many tests wait on child processes (CLI runs, simulated meshes,
    multi-process jobs) and a third worker on 2 cores keeps the cores busy. Measured on the idle 2-core AMD EPYC
    (while the workers still used the cache, before 6 Dec 2026):
    cold 13 min 36 s with 2 workers vs 15 min 5 s with 3; warm 5 min 25 s with 3 vs 6 min 8 s – 6 min 48 s with 2
    (6 min 8 s with 4)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    warm = _CACHE.is_dir() and any(_CACHE.iterdir())
    return max(1, cores + cores // 2 if warm else cores)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--compile-report", metavar="FILE", default=None,
                     help="append a line per test to FILE (FILE.gwN under xdist): node id, wall seconds, XLA compile "
                          "seconds and programs compiled in the test process (child processes not included)")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") == "loadscope":
        config.option.loadscopereorder = False  # the order below instead
    if config.getoption("compile_report"):
        import jax.monitoring

        def listen(event: str, seconds: float, **_) -> None:
            if event == "/jax/core/compile/backend_compile_duration":
                _COMPILES[0] += seconds
                _COMPILES[1] += 1
        jax.monitoring.register_event_duration_secs_listener(listen)


_COMPILES = [0.0, 0]  # XLA compile seconds and programs so far in this process


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """``--compile-report``: where a cold suite's time goes (setup and teardown included, module fixtures too)."""
    path = item.config.getoption("compile_report")
    if not path:
        return (yield)
    import time

    start, (seconds, programs) = time.perf_counter(), _COMPILES
    result = yield
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    with open(f"{path}.{worker}" if worker else path, "a", encoding="utf-8") as f:
        f.write(f"{item.nodeid}\t{time.perf_counter() - start:.2f}\t{_COMPILES[0] - seconds:.2f}\t"
                f"{_COMPILES[1] - programs}\n")
    return result


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules in :data:`HEAVY_FIRST` first, the others by number of tests (xdist's own order); each module's
    tests stay together and in their order."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    modules: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        modules.setdefault(item.nodeid.split("::")[0], []).append(i)

    def key(module: str) -> tuple[int, int, int]:
        name = Path(module).stem
        return rank.get(name, len(rank)), -len(modules[module]) if name not in rank else 0, modules[module][0]

    items[:] = [items[i] for module in sorted(modules, key=key) for i in modules[module]]


def free_test_memory() -> None:
    """Drop JAX's compiled programs and traces, collect garbage and hand freed heap back to the OS."""
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.clear_caches()
    gc.collect()
    with contextlib.suppress(AttributeError, OSError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)  # glibc keeps freed arenas mapped otherwise


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


#: A worker drops its compiled programs after a module only once it holds more than this much memory.
RESIDENT_LIMIT = float(os.environ.get("ESJAX_TEST_RESIDENT_GB", "2.5")) * 2**30


@pytest.fixture(autouse=True, scope="module")
def _free_memory_after_each_module():
    """A worker runs a few hundred tests, and every module's compiled programs stayed in its caches: its memory only
    grew, to 4.2 GB by the end of the suite (3 workers, session 24), and a CI run died of a MemoryError in a worker
    (stop 49). Clearing after every module cost a recompile of every program the next module shares (the same small
    models, the same update programs), so a worker now clears only past :data:`RESIDENT_LIMIT`; recompiles after a
    clear mostly come from the persistent cache."""
    yield
    if resident_bytes() > RESIDENT_LIMIT:
        free_test_memory()


def subprocess_env(*, devices: int | None = None, fast: bool = False, xla_flags: str = "",
                   **extra: str) -> dict[str, str]:
    """Environment of a child Python process: the repository importable, JAX on CPU with ``devices``
    simulated devices (default: one), :data:`FAST_XLA` if ``fast``, and ``xla_flags``; none of this process's
    ``ESJAX_*`` / ``JAX_*`` / ``XLA_FLAGS`` settings except the shared compilation cache; ``extra`` last."""
    env = {k: v for k, v in os.environ.items()
           if k in _CACHE_SETTINGS or (not k.startswith(("ESJAX_", "JAX_")) and k != "XLA_FLAGS")}
    flags = " ".join(filter(None, [FAST_XLA if fast else "", xla_flags,
                                   f"--xla_force_host_platform_device_count={devices}" if devices else ""]))
    env.update({"PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), "JAX_PLATFORMS": "cpu"})
    if flags:
        env["XLA_FLAGS"] = flags
    env.update(extra)
    return env


def run_python(code: str | Sequence[str], *args: str | Path, devices: int | None = None, fast: bool = False,
               xla_flags: str = "", env: dict[str, str] | None = None, cwd: Path | str = REPO, timeout: float = 600,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -c code *args`` (a string) or ``python *code *args`` (a sequence, e.g. ``["-m", "esjax.run"]``)
    in a child process with :func:`subprocess_env` (``env`` adds to it), capturing text output. With ``check``
    the test fails, showing the tail of both streams, unless the child exits 0."""
    argv = [sys.executable, "-c", code] if isinstance(code, str) else [sys.executable, *code]
    proc = subprocess.run([*argv, *map(str, args)], env=subprocess_env(devices=devices, fast=fast, xla_flags=xla_flags,
                                                                        **(env or {})),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"child process exited {proc.returncode}: {' '.join(argv[1:2])} ...\n"
                    f"STDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}")
    return proc


def same_bits(a, b) -> bool:
    """Two pytrees hold the same leaves bit for bit (dtype, shape and bytes; NaNs compare by their bits)."""
    import jax
    import numpy as np

    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in ((np.asarray(p), np.asarray(q)) for p, q in zip(leaves_a, leaves_b)))


def theta_moved(records: Sequence[dict]) -> bool:
    """Some update of a run changed θ (a nonzero update norm). Two runs' final θ compared bit for bit prove
    something only then: a random policy on a hard task can score 0 in every member, and then θ never moves."""
    return any(r.get("kind") == "update" and (r.get("update_norm") or 0) > 0 for r in records)


def reward_by_trace(monkeypatch, engine_cls) -> None:
    """Train episodes of ``engine_cls`` (RolloutEngine / GenerateEngine) score a number drawn from what they did
    (a hash of the actions taken), not WebShop's reward: a tiny random policy's members then differ in fitness at
    every update and θ moves, deterministically, so tests that compare θ bit for bit can fail."""
    import zlib

    tick = engine_cls.tick

    def scored(self, params_at):
        finished, stats = tick(self, params_at)
        for episode in finished:
            if episode.kind == "train" and episode.failure is None:
                episode.reward = zlib.crc32(repr(episode.trace).encode()) % 1000 / 1000
        return finished, stats

    monkeypatch.setattr(engine_cls, "tick", scored)


def uneven_episodes(monkeypatch, engine_cls) -> None:
    """Train episodes of ``engine_cls`` end after 1 … max_steps steps (a hash of the member and position) instead
    of all running to ``env.max_steps`` in lockstep: rows of different versions are then live in the same tick,
    as in a real asynchronous run (through the engines' public ``step_budget``)."""
    import zlib

    budget = engine_cls.step_budget

    def uneven(self, episode):
        if episode.kind == "train":
            key = f"{episode.version},{episode.index},{episode.position}".encode()
            return 1 + zlib.crc32(key) % self.max_steps
        return budget(self, episode)

    monkeypatch.setattr(engine_cls, "step_budget", uneven)


def interrupt_after_first_update(proc: subprocess.Popen, run_dir: Path, timeout: float = 300) -> str:
    """Send SIGINT to a ``python -m esjax.run`` child once its first update record is written (the run well under
    way), wait for it to exit and return its stderr; kills it if it outlives ``timeout``."""
    import signal
    import time

    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            metrics = run_dir / "metrics.jsonl"
            if metrics.is_file() and '"kind": "update"' in metrics.read_text():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def free_port() -> int:
    """A local TCP port nobody listens on right now (for a child's distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def python_child() -> Callable[..., subprocess.CompletedProcess]:
    """:func:`run_python`: a child Python process, e.g. ``python_child(SCRIPT, out, devices=8)`` for a mesh."""
    return run_python


@pytest.fixture(scope="session")
def child_env() -> Callable[..., dict[str, str]]:
    """:func:`subprocess_env`, for children started with ``subprocess.Popen`` (several processes at once)."""
    return subprocess_env


@pytest.fixture
def port() -> int:
    """:func:`free_port`."""
    return free_port()
