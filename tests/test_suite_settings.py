"""The suite's own process settings (tests/conftest.py): what keeps one crash from costing the whole run."""

from __future__ import annotations

import jax
from conftest import _CACHE, subprocess_env


def test_workers_compile_without_the_persistent_cache_and_children_with_it():
    """A test process never loads a cached executable (an abort inside XLA there kills the worker and can hang
    pytest-xdist); the child processes tests start share the cache folder."""
    assert jax.config.jax_enable_compilation_cache is False
    env = subprocess_env(devices=2)
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(_CACHE) and "JAX_ENABLE_COMPILATION_CACHE" not in env


def test_a_hung_test_fails_after_the_suite_timeout(pytestconfig):
    """pytest-timeout bounds every test (pyproject.toml), so a hang fails one test instead of stalling CI."""
    assert pytestconfig.getini("timeout") and float(pytestconfig.getini("timeout")) >= 600


def test_compiled_programs_are_dropped_between_modules():
    """What runs after every test module (tests/conftest.py) empties JAX's compiled-program caches, so a worker's
    memory does not grow with the number of modules it has run."""
    from conftest import free_test_memory

    square = jax.jit(lambda x: x * x)
    square(3.0)
    assert square._cache_size() == 1
    free_test_memory()
    assert square._cache_size() == 0
