"""The suite's own process settings (tests/conftest.py): what keeps one crash from costing the whole run."""

from __future__ import annotations

import jax
from conftest import _CACHE, subprocess_env


def test_workers_and_children_share_the_persistent_cache():
    """The test processes and the child processes tests start compile into one cache folder (a crash while loading a
    cached executable costs one rerun of that test: crash_rerun.py); ``ESJAX_TEST_XLA_CACHE=off`` turns it off for
    the workers."""
    import os

    assert jax.config.jax_enable_compilation_cache is (os.environ.get("ESJAX_TEST_XLA_CACHE") != "off")
    assert jax.config.jax_compilation_cache_dir == str(_CACHE)
    env = subprocess_env(devices=2)
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(_CACHE) and "JAX_ENABLE_COMPILATION_CACHE" not in env


def test_a_hung_test_fails_after_the_suite_timeout(pytestconfig):
    """pytest-timeout bounds every test (pyproject.toml), so a hang fails one test instead of stalling CI."""
    assert pytestconfig.getini("timeout") and float(pytestconfig.getini("timeout")) >= 600


def test_compiled_programs_are_dropped_when_a_worker_grows():
    """What runs after a test module once the worker holds more than ``RESIDENT_LIMIT`` (tests/conftest.py) empties
    JAX's compiled-program caches, so a worker's memory does not grow with the number of modules it has run."""
    from conftest import RESIDENT_LIMIT, free_test_memory, resident_bytes

    assert 0 < resident_bytes() < 64 * 2**30 and RESIDENT_LIMIT > 0

    square = jax.jit(lambda x: x * x)
    square(3.0)
    assert square._cache_size() == 1
    free_test_memory()
    assert square._cache_size() == 0


CRASHING_MODULE = '''
import os
from pathlib import Path

def test_before():
    pass

def test_crashes_once():
    flag = Path(os.environ["CRASH_FLAG"])
    if not flag.exists():
        flag.touch()
        os.abort()

def test_crashes_always():
    os.abort()

def test_after():
    pass
'''


def test_a_crashed_worker_reruns_its_test_once_and_the_run_goes_on(tmp_path):
    """``--dist loadscope`` with tests/crash_rerun.py: a test that kills its worker once passes on its second run in a
    new worker, one that kills it every time fails, the rest of its module still runs, and the run ends (xdist's own
    ``loadscope`` hung here). Both are named in the summary."""
    from conftest import REPO, run_python

    (tmp_path / "conftest.py").write_text("from crash_rerun import pytest_terminal_summary, "
                                          "pytest_xdist_make_scheduler  # noqa: F401\n")
    (tmp_path / "test_crashing.py").write_text(CRASHING_MODULE)
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    proc = run_python(["-m", "pytest", "-q", "-n", "2", "--dist", "loadscope", "-p", "no:cacheprovider",
                       str(tmp_path)], env={"PYTHONPATH": str(REPO / "tests"), "CRASH_FLAG": str(tmp_path / "crashed")},
                      cwd=tmp_path, timeout=300, check=False)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "1 failed, 4 passed" in out, out[-3000:]
    assert "FAILED test_crashing.py::test_crashes_always" in out
    summary = out.split("tests that crashed their worker and ran again in a new one")[1]
    assert "test_crashing.py::test_crashes_once" in summary and "test_crashing.py::test_crashes_always" in summary
