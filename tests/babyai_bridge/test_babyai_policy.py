"""The BabyAI agent (envs/babyai_bridge/agent.py), its word-level tokenizer, the embedded BabyAI policy
(esjax/assets/babyai_policy) and the script that regenerates it (experiments/pretrain_babyai_policy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from envs.babyai_bridge import ACTION_TEXTS, LEVEL_IDS, BabyAIAgent, LevelMix
from envs.babyai_bridge.tokenizer import build_tokenizer, vocabulary


def test_agent_implements_the_scoring_protocol():
    from esjax.loop.protocols import ScoringAgent

    agent = BabyAIAgent(build_tokenizer())
    assert isinstance(agent, ScoringAgent) and agent.score_norm == "mean"
    with pytest.raises(ValueError, match="score_norm"):
        BabyAIAgent(build_tokenizer(), score_norm="max")


def test_tokenizer_is_word_level_over_a_fixed_vocabulary():
    tokenizer = build_tokenizer()
    words = vocabulary()
    assert words[:3] == ["<pad>", "<eos>", "<unk>"] and len(words) == len(set(words)) < 128
    assert tokenizer.to_str() == build_tokenizer().to_str()  # no data in it: always the same
    ids = tokenizer.encode("You see a purple key 2 steps ahead.").ids
    assert [words[i] for i in ids] == ["you", "see", "a", "purple", "key", "2", "steps", "ahead", "."]
    assert tokenizer.encode("xylophone").ids == [2]  # <unk>


@pytest.mark.parametrize("level", sorted(LEVEL_IDS))
def test_agent_prompts_and_candidates_on_every_level(level):
    """Valid prompts (no unknown words, within the budget) and the six candidates, as the bot plays and remembers."""
    pytest.importorskip("minigrid")
    from envs.babyai_bridge import BabyAITextEnv
    from envs.babyai_bridge.agent import Candidate

    agent = BabyAIAgent(build_tokenizer())
    env = BabyAITextEnv("train", LevelMix.equal(level))
    rng = np.random.default_rng(0)
    for goal in range(3):
        observation, _ = env.reset(goal)
        memory = agent.new_memory(env.instruction)
        for step in range(6):
            available = env.available_actions()
            prompt, candidates, cand_ids = agent.step_inputs(observation, available, memory)
            text = agent.prompt_text(observation, memory)
            assert text.startswith(f"Mission: {env.instruction}.") and text.endswith("\nAction:")
            recent = ", ".join(memory.actions[-3:]) if step else "none"
            assert f"\nLast actions: {recent}.\nAction:" in text
            assert 0 < len(prompt) <= agent.max_prompt_tokens and 2 not in prompt  # no <unk>
            assert [c.text for c in candidates] == [c.action for c in candidates] == list(ACTION_TEXTS)
            assert all(1 <= len(ids) <= 2 and 2 not in ids for ids in cand_ids)
            assert len({tuple(ids) for ids in cand_ids}) == 6
            action = ACTION_TEXTS[int(rng.integers(3))]
            agent.remember(memory, available, Candidate(action, action))
            observation, _, done, info = env.step(action)
            assert info["valid"]
            if done:
                break


def test_long_prompts_keep_head_and_tail():
    agent = BabyAIAgent(build_tokenizer(), max_prompt_tokens=10)
    ids = agent.encode_prompt(" ".join(["a"] * 30) + " walls")
    assert len(ids) == 10 and ids[-1] == agent.encode("walls")[0]


def test_quick_pretraining_is_deterministic_and_loadable(tmp_path):
    """Two --quick runs give identical folders; the folder loads through the HF path and scores the agent's
    candidates."""
    pytest.importorskip("minigrid")
    from esjax.agent.policy import load_policy
    from esjax.agent.scoring import score_candidates
    from experiments import pretrain_babyai_policy as script

    first = script.main(["--quick", "--seed", "3", "--out", str(tmp_path / "a")])
    second = script.main(["--quick", "--seed", "3", "--out", str(tmp_path / "b")])
    assert first["digest"] == second["digest"]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    policy = load_policy("hf", str(tmp_path / "a"))
    assert policy.config.model_type == "qwen2" and policy.config.num_layers == 2
    agent = BabyAIAgent(policy.tokenizer)
    memory = agent.new_memory("go to the red ball")
    prompt, _, cand_ids = agent.step_inputs("Mission: go to the red ball.\nYou see no objects.", {}, memory)
    scores = score_candidates(policy.config, policy.params, [prompt], [cand_ids], norm="mean")
    assert scores.shape == (1, 6) and np.isfinite(scores).all()


def test_pretraining_width_and_depth_flags_shape_the_model_and_its_command(tmp_path):
    """--hidden, --layers and --mlp make another size of the same architecture, and the regenerate command the
    README prints names them (only when changed, so the shipped policy's command stays as it was)."""
    pytest.importorskip("minigrid")
    from esjax.agent.policy import load_policy
    from experiments import pretrain_babyai_policy as script

    report = script.main(["--quick", "--hidden", "32", "--layers", "3", "--mlp", "96", "--out", str(tmp_path / "w")])
    policy = load_policy("hf", report["args"]["out"])
    assert (policy.config.hidden_size, policy.config.num_layers, policy.config.intermediate_size) == (32, 3, 96)
    assert script.command_line(report["args"]).endswith(" --hidden 32 --layers 3 --mlp 96")
    assert "--hidden" not in script.command_line({**report["args"], "hidden": 64, "layers": 2, "mlp": 192})


def test_shipped_policy_loads_and_plays_valid_greedy_actions():
    """``model.embedded: babyai`` loads the shipped folder; its greedy actions on test instances (through the rollout
    engine) are all valid bridge actions."""
    pytest.importorskip("minigrid")
    from esjax.agent.policy import EMBEDDED_POLICIES, load_policy
    from esjax.config import load_config
    from esjax.model.params import param_count
    from experiments import pretrain_babyai_policy as script

    assert load_config(None, ["model.embedded=babyai"]).model.embedded == "babyai"
    folder = EMBEDDED_POLICIES["babyai"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"} <= \
        {f.name for f in folder.iterdir()}
    policy = load_policy("embedded", embedded="babyai")
    assert policy.config.model_type == "qwen2" and 100_000 < param_count(policy.params) < 1_000_000
    assert policy.tokenizer.to_str() == build_tokenizer().to_str()
    seen = []

    class Recording(BabyAIAgent):
        def remember(self, memory, available, picked):
            seen.append(picked.action)
            super().remember(memory, available, picked)

    agent = Recording(policy.tokenizer, memory_actions=script.MEMORY_ACTIONS)
    episodes = script.evaluate_policy(policy.config, policy.params, agent, "test", [0, 1, 2, 3], rows=4,
                                      max_steps=20)
    assert len(episodes) == 4 and all(e["steps"] >= 1 for e in episodes)
    assert seen and set(seen) <= set(ACTION_TEXTS)
