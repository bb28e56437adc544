"""Env pools fail rows, not runs: a session whose step raises or hangs past the step timeout comes back as a failed
row (done, reward 0, ``info['failure']``) and is replaced, on the in-process pool and inside ProcessEnvPool's
workers alike; a worker that stops answering altogether is killed and replaced, its stepped rows failed and its
other sessions replayed; a Ray actor that dies is replaced and its stepped rows failed.

The hang is a search engine that sleeps on the query ``stall`` (a Python-level hang the step timeout catches) or
stops its whole process on ``freeze`` (a worker that never answers). Its ShopSpec subclass lives in this module,
so spawned worker processes import it from here.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import signal
import sys
import threading
import time

import pytest
from ray_fixtures import fake_ray, real_ray

from envs.webshop_bridge import InProcessEnvPool, ProcessEnvPool, ShopSpec
from envs.webshop_bridge.factory import pool_of

TIMEOUT = 0.5


class _Stalling:
    """A search engine that hangs on the queries ``stall`` (sleeps) and ``freeze`` (stops its process)."""

    def __init__(self, engine):
        self.engine = engine

    def search(self, query: str, k: int):
        if query == "stall":
            time.sleep(5)
        elif query == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
        return self.engine.search(query, k)


@dataclasses.dataclass(frozen=True)
class StallingSpec(ShopSpec):
    def build(self):
        shop = super().build()
        return dataclasses.replace(shop, engine=_Stalling(shop.engine))


SPEC = StallingSpec(kind="synthetic", num_products=60, seed=0)
SESSIONS = functools.partial(pool_of, SPEC)  # what each Ray actor builds its sessions with
GOALS = [0, 1, 2, 3]


def _failure(result, row: int) -> str | None:
    return result[3][row].get("failure")


def _timed_out_session_fails_alone(pool) -> None:
    pool.reset(GOALS)
    out = pool.step(["search[stall]", "search[shoes]", None, "click[nothing]"], timeout=TIMEOUT)
    assert _failure(out, 0) == f"timeout: env step took longer than {TIMEOUT:g} s"
    assert out[2][0] and out[1][0] == 0.0
    assert _failure(out, 1) is None and "Page 1" in out[0][1] and out[3][2] == {"skipped": True}
    assert _failure(out, 3) is None and out[3][3]["valid"] is False  # an invalid action is a no-op, not a failure
    # the failed row is reset and used again; the others go on
    assert pool.reset_rows([0], [5])[0][1]["goal_index"] == 5
    out = pool.step(["search[shoes]", "click[< prev]", None, None], timeout=TIMEOUT)
    assert _failure(out, 0) is None and _failure(out, 1) is None
    assert pool.instructions([0, 2]) == [SPEC.build().goals[g].instruction_text for g in (5, 2)]


def test_in_process_pool_times_out_and_replaces_a_hung_session():
    pool = InProcessEnvPool(SPEC.build(), len(GOALS))
    pool.reset(GOALS)
    first = pool.envs[0]
    _timed_out_session_fails_alone(pool)
    assert pool.envs[0] is not first


def test_in_process_pool_keeps_one_step_thread_and_ends_it_with_the_pool():
    def step_threads():
        return {t for t in threading.enumerate() if t.name == "esjax-env-step"}

    others = step_threads()  # e.g. a hung step abandoned by another test
    pool = InProcessEnvPool(SPEC.build(), 2)
    pool.reset([0, 1])
    for _ in range(3):
        assert _failure(pool.step(["search[shoes]", None], timeout=TIMEOUT), 0) is None
    (helper,) = step_threads() - others  # one thread, kept between calls
    pool.close()
    helper.join(timeout=5)
    assert not helper.is_alive()
    pool.step(["search[shoes]", None], timeout=TIMEOUT)  # a closed pool still steps, on a new thread
    (helper,) = step_threads() - others
    del pool
    gc.collect()
    helper.join(timeout=5)
    assert not helper.is_alive()  # a collected pool's thread ends too


def test_in_process_pool_fails_a_raising_session_alone():
    pool = InProcessEnvPool(SPEC.build(), 2)
    pool.reset([0, 1])
    pool.envs[0].step = lambda action: 1 / 0
    out = pool.step(["search[a]", "search[b]"])
    assert _failure(out, 0) == "error: ZeroDivisionError: division by zero" and _failure(out, 1) is None


def test_process_pool_times_out_a_hung_session_in_its_worker():
    with ProcessEnvPool(SPEC, len(GOALS), workers=2) as pool:
        _timed_out_session_fails_alone(pool)
        assert pool.restarts == 0  # the worker itself answered


def test_process_pool_replaces_a_worker_that_stops_answering():
    reference = InProcessEnvPool(SPEC.build(), len(GOALS))
    with ProcessEnvPool(SPEC, len(GOALS), workers=2) as pool:
        for p in (pool, reference):
            p.reset(GOALS)
            p.step(["search[shoes]", "search[shirt]", "search[bag]", "search[hat]"])
        pid = pool.pids[0]
        out = pool.step(["search[freeze]", "click[next >]", None, None], timeout=TIMEOUT)
        assert pool.restarts == 1 and pool.pids[0] != pid
        assert _failure(out, 0) == "timeout: env worker 0 did not answer in time; replaced"
        assert _failure(out, 1) is None
        reference.step([None, "click[next >]", None, None])
        # worker 0's other session (row 2) was replayed in the new worker: it is where it was
        assert pool.available_actions([1, 2, 3]) == reference.available_actions([1, 2, 3])
        pool.reset_rows([0], [0])
        reference.reset_rows([0], [0])
        assert pool.available_actions() == reference.available_actions()


def test_ray_pool_replaces_a_dead_actor_and_fails_its_rows(monkeypatch):
    ray = fake_ray()
    monkeypatch.setitem(sys.modules, "ray", ray)
    from esjax.parallel.envpool_ray import RayEnvPool

    with RayEnvPool(SESSIONS, len(GOALS), workers=2) as pool:
        pool.reset(GOALS)
        dead = pool._actors[0]
        dead.dead = True  # every call to actor 0 now fails as a dead Ray actor's would
        out = pool.step(["search[a]", "search[b]", "search[c]", None], timeout=TIMEOUT)
        assert pool.restarts == 1 and pool._actors[0] is not dead
        assert [_failure(out, r) for r in range(3)] == ["timeout: env actor 0 did not answer in time; replaced",
                                                          None, "timeout: env actor 0 did not answer in time; replaced"]
        pool.reset_rows([0, 2], [0, 2])
        assert _failure(pool.step(["search[a]", None, "search[c]", None], timeout=TIMEOUT), 0) is None
    with RayEnvPool(SESSIONS, 2, workers=2) as pool, pytest.raises(ray.exceptions.RayActorError):
        pool._actors[1].dead = True
        pool.reset([0, 1])  # outside a timed step a dead actor is an error, as before


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ray.init starts its processes
def test_real_ray_pool_replaces_an_actor_that_stops_answering():
    from esjax.parallel.envpool_ray import RayEnvPool

    with real_ray():
        from ray import cloudpickle  # Ray's own copy pickles the actors' arguments

        cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors cannot import this test module
        try:
            with RayEnvPool(SESSIONS, len(GOALS), workers=2) as pool:
                pool.reset(GOALS)
                out = pool.step(["search[freeze]", "search[shoes]", None, None], timeout=TIMEOUT)
                assert pool.restarts == 1
                assert _failure(out, 0) == "timeout: env actor 0 did not answer in time; replaced"
                assert _failure(out, 1) is None and "Page 1" in out[0][1]
                pool.reset_rows([0, 2], [0, 2])
                out = pool.step(["search[shoes]", None, "search[stall]", None], timeout=TIMEOUT)
                assert _failure(out, 0) is None
                assert _failure(out, 2) == f"timeout: env step took longer than {TIMEOUT:g} s"  # timed in the actor
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
