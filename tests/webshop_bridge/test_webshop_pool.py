"""Env pools (in-process and multi-process), the official-env adapter and the interactive CLI."""

from __future__ import annotations

import io
import subprocess
import sys
import types

import numpy as np
import pytest
from webshop_fixtures import REPO

import envs.webshop_bridge.official as official
from envs.webshop_bridge import (
    InProcessEnvPool,
    OfficialWebShopEnv,
    ProcessEnvPool,
    ShopSpec,
    WebShopTextEnv,
    get_shop,
    official_available,
    oracle_actions,
)
from envs.webshop_bridge.cli import main

SPEC = ShopSpec(kind="synthetic", num_products=120, seed=2)


def _scripts(shop, goals):
    return [oracle_actions(shop, g) for g in goals]


def test_env_pool_matches_single_envs():
    shop = get_shop(SPEC)
    assert get_shop(SPEC) is shop  # one shop per process
    goals = [0, 1, 2, 3]
    scripts = _scripts(shop, goals)
    pool = InProcessEnvPool(shop, 4)
    obs, infos = pool.reset(goals)
    assert [i["goal_index"] for i in infos] == goals and pool.instructions() == [shop.goals[g].instruction_text
                                                                               for g in goals]
    rewards = np.zeros(4)
    for t in range(max(map(len, scripts))):
        actions = [s[t] if t < len(s) else None for s in scripts]
        obs, r, done, infos = pool.step(actions)
        rewards += r
        assert all(infos[i].get("skipped") for i, a in enumerate(actions) if a is None)
    assert done.all() and (rewards == 1.0).all()
    for g, script, final in zip(goals, scripts, obs):
        env = WebShopTextEnv(shop)
        env.reset(g)
        for a in script:
            last = env.step(a)[0]
        assert last == final
    assert len(pool.available_actions()) == 4
    with pytest.raises(ValueError):
        pool.step(["foo"])


def test_process_pool_matches_env_pool():
    shop = get_shop(SPEC)
    goals = [5, 6, 7]
    scripts = _scripts(shop, goals)
    local = InProcessEnvPool(shop, 3)
    with ProcessEnvPool(SPEC, 3, workers=2) as remote:
        assert remote.reset(goals)[0] == local.reset(goals)[0]
        for t in range(max(map(len, scripts))):
            actions = [s[t] if t < len(s) else None for s in scripts]
            a, b = remote.step(actions), local.step(actions)
            assert a[0] == b[0] and (a[1] == b[1]).all() and (a[2] == b[2]).all()
        assert remote.available_actions() == local.available_actions()
        assert b[2].all()


def test_process_pool_reports_worker_errors():
    with pytest.raises(RuntimeError, match="env worker failed"):
        ProcessEnvPool(ShopSpec(kind="webshop", path="/nonexistent"), 1, workers=1)


def test_official_adapter_with_a_stub(monkeypatch):
    calls = []

    class FakeTextEnv:
        def __init__(self, observation_mode, **kw):
            calls.append((observation_mode, kw))
            self.instruction_text = "find x"

        def reset(self, session=None):
            return f"WebShop [SEP] Instruction: [SEP] find x [SEP] Search #{session}", None

        def step(self, action):
            return "obs", 1, action == "click[buy now]", None

        def get_available_actions(self):
            return {"has_search_bar": True, "clickables": ["search"]}

    module = types.ModuleType("web_agent_site.envs.web_agent_text_env")
    module.WebAgentTextEnv = FakeTextEnv
    monkeypatch.setitem(sys.modules, "web_agent_site.envs.web_agent_text_env", module)
    monkeypatch.setattr(official, "official_available", lambda: True)
    env = OfficialWebShopEnv(num_products=1000)
    assert calls == [("text", {"num_products": 1000})]
    assert env.reset(3) == ("WebShop [SEP] Instruction: [SEP] find x [SEP] Search #3",
                            {"goal_index": 3, "instruction": "find x"})
    assert env.step("click[buy now]") == ("obs", 1.0, True, {})
    assert env.available_actions()["has_search_bar"] and env.instruction == "find x"


@pytest.mark.skipif(not official_available(), reason="WebShop's web_agent_site is not installed")
def test_official_env_agrees_on_search_page():  # pragma: no cover - needs WebShop's full stack
    env = OfficialWebShopEnv(num_products=1000, human_goals=False)
    obs, _ = env.reset(0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] ") and obs.endswith(" [SEP] Search")


def test_official_adapter_refuses_without_webshop(monkeypatch):
    monkeypatch.setattr(official, "official_available", lambda: False)
    with pytest.raises(ImportError, match="web_agent_site"):
        OfficialWebShopEnv()


def test_cli_plays_an_episode():
    shop = get_shop(ShopSpec(kind="synthetic", num_products=300, seed=0))
    actions = oracle_actions(shop, 4)
    out = io.StringIO()
    assert main(["--data", "synthetic", "--goal", "4"], inp=io.StringIO("foo\n" + "\n".join(actions) + "\n"),
                out=out) == 0
    text = out.getvalue()
    split = next(name for name, indices in shop.splits.items() if 4 in indices)
    assert f"goal #4 ({split} split): {shop.goals[4].instruction_text}" in text
    assert "[SEP]" not in text and "\nWebShop\nInstruction:\n" in text  # separators shown as line breaks
    assert "(no-op: not of the form search[...] or click[...])" in text
    assert "reward: 1.0000" in text and "r_type: 1.0" in text and "actions: search[<query>]  click[search]" in text


def test_cli_as_module_and_bad_data(tmp_path):
    run = subprocess.run([sys.executable, "-m", "envs.webshop_bridge", "--data", "synthetic",
                          "--num-products", "100", "--goal", "0"], input="search[x]\nquit\n", capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0 and "Page 1 (Total results:" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "envs.webshop_bridge", "--data", str(tmp_path / "none")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "file or directory not found" in bad.stderr


def test_bridge_imports_no_jax_and_of_esjax_only_what_every_task_shares():
    """The bridge stays light (env worker processes import it): importing it pulls in no JAX, and of esjax only the
    pieces every task shares (the errors' base, the pools' row answers and worker processes). WebShop as an esjax
    task (``task.py``, which reads the config schema) is imported by the config that names it, not by the package."""
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import envs.webshop_bridge;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('esjax', 'jax')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    imported = eval(out.stdout.strip())  # noqa: S307 - a printed list of module names
    assert not [m for m in imported if m.split(".")[0] == "jax"]
    assert set(imported) <= {"esjax", "esjax.errors", "esjax.loop", "esjax.loop.coordinator", "esjax.loop.envpool",
                             "esjax.loop.envpool_process",
                             "esjax.loop.staleness", "esjax.loop.tasks", "esjax.loop.types"}, imported


def test_process_pool_in_a_script_without_main_guard_says_what_to_fix(tmp_path, python_child):
    """Spawned workers import the main module again: a script that builds the pool at top level makes every worker
    try to start workers of its own; the pool says so instead of "connection lost (EOFError)"."""
    script = tmp_path / "unguarded.py"
    script.write_text("from envs.webshop_bridge import ProcessEnvPool, ShopSpec\n"
                      "ProcessEnvPool(ShopSpec(kind='synthetic', num_products=20), 2, workers=1)\n")
    proc = python_child([str(script)], check=False, timeout=300)
    assert proc.returncode != 0
    assert "exited during start-up" in proc.stderr and "if __name__ == '__main__':" in proc.stderr, proc.stderr[-2000:]
