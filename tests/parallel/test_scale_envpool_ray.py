"""The Ray env pool behaves exactly like the in-process EnvPool: the same sessions, observations, rewards and
available actions for the same goals and actions. The fan-out logic is checked against an in-process
stand-in for Ray (always runs); a real local Ray cluster is used when Ray is installed."""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest
from ray_fixtures import fake_ray, real_ray

from envs.webshop_bridge.factory import ShopSpec, get_shop, pool_of
from envs.webshop_bridge.pool import InProcessEnvPool

SPEC = ShopSpec(kind="synthetic", num_products=40, seed=0)
SESSIONS = functools.partial(pool_of, SPEC)  # what each Ray actor builds its sessions with


def _drive(pool, goals):
    obs, _ = pool.reset(goals)
    trace = [obs]
    actions = [f"search[{ins}]" for ins in pool.instructions()]
    actions[1] = None  # a session left alone this tick
    obs, rewards, done, _ = pool.step(actions)
    trace += [obs, rewards.tolist(), done.tolist()]
    clicks = [a["clickables"][min(2, len(a["clickables"]) - 1)] for a in pool.available_actions()]
    obs, rewards, done, _ = pool.step([f"click[{c}]" for c in clicks])
    trace += [obs, rewards.tolist(), done.tolist(), pool.reset_one(3, goals[0])[0]]
    return trace


def _reference(goals):
    return _drive(InProcessEnvPool(get_shop(SPEC), len(goals)), goals)


def test_ray_pool_fan_out_matches_the_in_process_pool(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", fake_ray())
    from esjax.parallel.envpool_ray import RayEnvPool

    goals = [0, 5, 9, 11, 20]
    with RayEnvPool(SESSIONS, len(goals), workers=2) as pool:
        got = _drive(pool, goals)
        with pytest.raises(ValueError, match="one per session"):
            pool.step(["click[buy now]"])
    assert got == _reference(goals)


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    from esjax.parallel.envpool_ray import RayEnvPool, RayUnavailable

    with pytest.raises(RayUnavailable, match=r"esjax\[ray\]"):
        RayEnvPool(SESSIONS, 2)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # ray.init starts its processes
def test_real_local_ray_cluster():
    from esjax.parallel.envpool_ray import RayEnvPool

    goals = [1, 2, 3, 4]
    with real_ray(), RayEnvPool(SESSIONS, len(goals), workers=2) as pool:
        got = _drive(pool, goals)
    assert np.array_equal(np.asarray(got[2]), np.asarray(_reference(goals)[2]))
    assert got == _reference(goals)


def test_config_ray_address_reaches_ray_init(monkeypatch):
    """``env.ray_address`` is the cluster ``ray.init`` joins when Ray is not running yet."""
    ray = fake_ray()
    calls = []
    ray.is_initialized = lambda: bool(calls)
    ray.init = lambda **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "ray", ray)
    from esjax.config import load_config
    from esjax.train.parts import build_pool, load_task

    config = load_config(None, ["env.data=synthetic", "env.num_products=40", "env.pool=ray", "env.workers=1",
                                "env.ray_address=ray://head:10001"])
    pool = build_pool(config.env, load_task(config.env), 2)
    pool.close()
    assert [c["address"] for c in calls] == ["ray://head:10001"]
