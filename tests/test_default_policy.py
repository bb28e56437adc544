"""The embedded default policy: shipped as an HF folder, loadable through the HF path, better than random,
and its pretraining script is deterministic given its seed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from esjax.agent.policy import EMBEDDED_POLICY_DIR, load_policy

ROOT = Path(__file__).resolve().parents[1]


def _pretrain_module():
    spec = importlib.util.spec_from_file_location("pretrain_default_policy",
                                                  ROOT / "experiments" / "pretrain_default_policy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_embedded_policy_is_a_small_hf_folder():
    files = {f.name for f in EMBEDDED_POLICY_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    size = sum(f.stat().st_size for f in EMBEDDED_POLICY_DIR.iterdir() if f.is_file())
    assert size < 10e6
    import jinja2.ext  # noqa: F401  render_chat uses jinja2.ext without importing it (reported upstream)

    from esjax.model.hf import load_chat_template, render_chat

    template = load_chat_template(EMBEDDED_POLICY_DIR)
    assert template and "<|user|>" in render_chat(template, [{"role": "user", "content": "hi"}])


def test_embedded_policy_loads_through_hf_path_and_beats_random():
    from envs.webshop_bridge import RandomPolicy, evaluate, synthetic_shop
    from esjax.agent.webshop import WebShopAgent
    from esjax.evaluate import evaluate_policy
    from esjax.model.params import param_count

    policy = load_policy("hf", str(EMBEDDED_POLICY_DIR))
    embedded = load_policy("embedded")
    assert policy.config == embedded.config
    assert policy.config.model_type == "qwen2"
    assert 50_000 < param_count(policy.params) < 2_000_000
    shop = synthetic_shop(500, seed=0)  # the default config's shop
    goals = list(shop.split("test"))[:16]
    result = evaluate_policy(policy.config, policy.params, WebShopAgent(policy.tokenizer, "compact"), shop, goals,
                             max_steps=10)
    random_result, _ = evaluate(shop, lambda: RandomPolicy(0), goals, max_steps=10)
    assert result["score"] > random_result.score + 15


def test_agent_encoding_matches_pretraining_encoding():
    """The pretraining script encodes steps exactly as WebShopAgent.step_inputs does."""
    from envs.webshop_bridge import WebShopTextEnv, oracle_actions, synthetic_shop
    from esjax.agent.webshop import EpisodeMemory, WebShopAgent, candidates_for, compact_prompt, page_kind

    policy = load_policy("embedded")
    agent = WebShopAgent(policy.tokenizer, "compact")
    shop = synthetic_shop(500, seed=0)
    goal = shop.split("train")[0]
    env = WebShopTextEnv(shop)
    obs, _ = env.reset(goal)
    memory = EpisodeMemory(env.instruction)
    for action in oracle_actions(shop, goal):
        available = env.available_actions()
        prompt_ids, candidates, cand_ids = agent.step_inputs(obs, available, memory)
        assert prompt_ids == agent.encode_prompt(compact_prompt(obs, available, memory))
        assert [c.text for c in candidates] == [c.text for c in candidates_for(obs, available, memory)]
        picked = next(c for c in candidates if c.action == action)
        memory.record(page_kind(available), picked)
        obs, _, done, _ = env.step(action)
    assert done


@pytest.mark.slow
def test_quick_pretraining_is_deterministic(tmp_path):
    module = _pretrain_module()
    first = module.main(["--quick", "--seed", "3", "--out", str(tmp_path / "a")])
    second = module.main(["--quick", "--seed", "3", "--out", str(tmp_path / "b")])
    assert first["digest"] == second["digest"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    other = module.main(["--quick", "--seed", "4", "--out", str(tmp_path / "c")])
    assert other["digest"] != first["digest"]
