"""Ray for the tests: an in-process stand-in for just enough of its API (always available), and a real local
cluster when Ray is installed (the env-pool tests of tests/parallel and tests/train share both)."""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
import types
from pathlib import Path

import pytest


def fake_ray() -> types.ModuleType:
    """Just enough of Ray's API, executed synchronously in this process."""
    ray = types.ModuleType("ray")

    class RayActorError(Exception):
        pass

    class _Ref:
        def __init__(self, value, error=None):
            self.value, self.error = value, error

        def result(self):
            if self.error is not None:
                raise self.error
            return self.value

    class _Method:
        def __init__(self, fn, handle):
            self.fn, self.handle = fn, handle

        def remote(self, *args):
            if self.handle.dead:  # a dead actor: the call's result raises when read
                return _Ref(None, RayActorError("the actor died"))
            return _Ref(self.fn(*args))

    class _Handle:
        def __init__(self, obj):
            self.obj, self.dead = obj, False

        def __getattr__(self, name):
            return _Method(getattr(self.obj, name), self)

    class _Actor:
        def __init__(self, cls):
            self.cls = cls

        def options(self, **_):
            return self

        def remote(self, *args):
            return _Handle(self.cls(*args))

    ray.remote = _Actor
    ray.is_initialized = lambda: True
    ray.get = lambda refs, timeout=None: refs.result() if isinstance(refs, _Ref) else [r.result() for r in refs]
    ray.kill = lambda actor: None
    ray.exceptions = types.SimpleNamespace(GetTimeoutError=TimeoutError, RayActorError=RayActorError)
    return ray


@contextlib.contextmanager
def real_ray():
    """A real local Ray cluster (2 CPUs) for one test, skipped without Ray. One at a time on this machine: test
    modules run in parallel (pytest-xdist) and a second ``ray.init`` may join the first one's cluster."""
    ray = pytest.importorskip("ray")
    with open(Path(tempfile.gettempdir()) / "esjax-real-ray-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
