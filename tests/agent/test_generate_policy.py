"""The generative policy's recipe (experiments/pretrain_generate_policy.py, issue 36): the teacher's steps are
recorded exactly as generate mode renders them, and the quick mode is deterministic."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from experiments import pretrain_generate_policy as recipe  # noqa: E402


def test_demonstrations_are_generate_mode_prompts_and_written_actions():
    from envs.webshop_bridge import WebShopTextEnv, load_webshop
    from esjax.agent.policy import load_policy

    agent = recipe.generate_agent(load_policy("embedded"))
    shop = load_webshop(recipe.DATA, seed=recipe.CATALOG_SEED)
    goals = list(shop.split("train"))[:3]
    pairs, reward = recipe.demonstrations(shop, goals, agent, hasty=0.0, seed=0)
    assert 0.0 < reward <= 1.0 and len(pairs) >= 3 * 3  # search, open, (options), buy per goal
    stop = min(agent.stop_token_ids)
    env = WebShopTextEnv(shop)
    observation, _ = env.reset(goals[0])
    first_prompt, first_reply = pairs[0]
    assert first_prompt == agent.prompt_ids(observation, env.available_actions(), agent.new_memory(env.instruction))
    assert first_reply[-1] == stop and agent.decode(first_reply).startswith(" search[")
    _, action, parsed = agent.parse(agent.decode(first_reply))
    assert parsed and action == f"search[{env.goal.instruction_text}]"
    assert agent.decode(pairs[-1][1]).strip() == "click[buy now]"
    data = recipe.encode_pairs(pairs)
    assert sum(len(g["tokens"]) for g in data.values()) == len(pairs)
    for group in data.values():  # targets are the reply tokens only, inside the mask
        assert (group["target"] <= group["mask"]).all() and group["target"].any(axis=1).all()


def test_quick_mode_is_deterministic(tmp_path):
    first = recipe.main(["--quick", "--out", str(tmp_path / "a")])
    second = recipe.main(["--quick", "--out", str(tmp_path / "b")])
    assert first["digest"] == second["digest"] != first["init_digest"]  # it trained, and the same way twice
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
