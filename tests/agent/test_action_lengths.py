"""Where a written reply first holds a complete action (:meth:`GenerateAgent.action_lengths`, on generate mode's
decode path): the byte-level fast path gives exactly what decoding each prefix and searching it gives."""

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def agent():
    from esjax.agent.policy import load_policy
    from esjax.config import load_config
    from esjax.train.parts import build_generate_agent

    config = load_config(REPO / "configs" / "generate.yaml")
    return build_generate_agent(config.agent, load_policy(config.model.source, embedded=config.model.embedded))


def _by_decoding(agent, ids, checked):
    """The specification: decode every prefix ending at a closing token after ``checked`` and search it."""
    for n in range(checked + 1, len(ids) + 1):
        if ids[n - 1] in agent.closing_ids and agent.complete(agent.decode(ids[:n])):
            return n
    return 0


def test_ascii_tokens_decode_to_their_pieces_joined(agent):
    pieces = agent._ascii_pieces
    assert pieces is not None  # the shipped tokenizer is byte-level: the fast path is the one in use
    ascii_ids = [i for i, p in enumerate(pieces) if p is not None]
    assert len(ascii_ids) > 0.9 * len(pieces)
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids = rng.choice(ascii_ids, int(rng.integers(1, 40))).tolist()
        assert agent.decode(ids) == "".join(pieces[i] for i in ids)


def test_action_lengths_equal_decoding_every_prefix(agent):
    tokenizer, rng = agent.tokenizer, np.random.default_rng(1)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    stop = sorted(agent.stop_token_ids)
    closing = sorted(agent.closing_ids)
    non_ascii = [i for i, p in enumerate(agent._ascii_pieces) if p is None and i not in agent.stop_token_ids]
    texts = [" search[red shirt, size medium]", " click[buy now]", " click[b07hrfsnl4]", "Click[Next >]",
             "search[a] then click[b]", "xsearch[no] search[yes]", "search[broken", "click[x\n] click[y]",
             " search[[nested]]", "]] click[]", "thought: fine\nAction: click[< prev]"]
    replies = [encode(t) for t in texts]
    for _ in range(400):  # real actions with noise around them, and noise alone
        head = rng.choice(closing + list(range(200)), int(rng.integers(0, 4))).tolist()
        tail = rng.choice(closing + stop + non_ascii[:20] + list(range(200)), int(rng.integers(0, 6))).tolist()
        replies.append(head + list(replies[int(rng.integers(0, len(texts)))]) + tail)
    paths = {"fast": 0, "general": 0, "found": 0}
    for ids in replies:
        ids = [int(i) for i in ids]
        for checked in {0, len(ids) // 2, max(len(ids) - 1, 0)}:
            want = _by_decoding(agent, ids, checked)
            assert agent.action_lengths([ids], [checked]) == [want], (agent.decode(ids), checked)
            fast = all(agent._ascii_pieces[i] is not None for i in ids)
            paths["fast" if fast else "general"] += 1
            paths["found"] += want > 0
    assert min(paths.values()) > 50, paths
    assert agent.action_lengths([], []) == []
