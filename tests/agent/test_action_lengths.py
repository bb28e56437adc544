"""Where a written reply first holds a complete action (generate mode's decode path): the action automaton over
token ids, and :meth:`GenerateAgent.action_lengths` for the replies it can't read, give exactly what decoding each
prefix and searching it gives."""

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def agent():
    from envs.webshop_bridge.task import generate_agent
    from esjax.agent.policy import load_policy
    from esjax.config import load_config

    config = load_config(REPO / "configs" / "generate.yaml")
    return generate_agent(load_policy(config.model.source, embedded=config.model.embedded), config.agent)


def _by_decoding(agent, ids, checked):
    """The specification: decode every prefix ending at a closing token after ``checked`` and search it."""
    for n in range(checked + 1, len(ids) + 1):
        if ids[n - 1] in agent.closing_ids and agent.complete(agent.decode(ids[:n])):
            return n
    return 0


def test_ascii_tokens_decode_to_their_pieces_joined(agent):
    pieces = agent._pieces
    assert pieces is not None  # the shipped tokenizer is byte-level: the fast path is the one in use
    ascii_ids = np.flatnonzero(pieces.ascii[:pieces.outside])
    assert len(ascii_ids) > 0.9 * pieces.outside
    rng = np.random.default_rng(0)
    replies = [rng.choice(ascii_ids, int(rng.integers(1, 40))).tolist() for _ in range(300)]
    text, ends = pieces.texts(np.array([i for r in replies for i in [*r, pieces.separator]]))
    assert text.tobytes().decode() == "".join(agent.decode(r) + "\n" for r in replies)
    assert ends[-1] == len(text) and ends[len(replies[0])] == len(agent.decode(replies[0])) + 1


def test_action_lengths_equal_decoding_every_prefix(agent):
    """The agent's exact path, which the engine asks for the replies its automaton can't read, on a batch of replies
    checked from several points: ASCII-only replies and others, with and without an action."""
    tokenizer, rng = agent.tokenizer, np.random.default_rng(1)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    stop = sorted(agent.stop_token_ids)
    closing = sorted(agent.closing_ids)
    pieces = agent._pieces
    non_ascii = [int(i) for i in np.flatnonzero(~pieces.ascii[:pieces.outside]) if i not in agent.stop_token_ids]
    texts = [" search[red shirt, size medium]", " click[buy now]", " click[b07hrfsnl4]", "Click[Next >]",
             "search[a] then click[b]", "xsearch[no] search[yes]", "search[broken", "click[x\n] click[y]",
             " search[[nested]]", "]] click[]", "thought: fine\nAction: click[< prev]"]
    replies = [encode(t) for t in texts]
    for _ in range(400):  # real actions with noise around them, and noise alone
        head = rng.choice(closing + list(range(200)), int(rng.integers(0, 4))).tolist()
        tail = rng.choice(closing + stop + non_ascii[:20] + list(range(200)), int(rng.integers(0, 6))).tolist()
        replies.append(head + list(replies[int(rng.integers(0, len(texts)))]) + tail)
    rows = [([int(i) for i in ids], checked) for ids in replies for checked in {0, len(ids) // 2, max(len(ids) - 1, 0)}]
    rows = [(ids, checked) for ids, checked in rows if ids]
    got = agent.action_lengths([ids for ids, _ in rows], [checked for _, checked in rows])
    want = [_by_decoding(agent, ids, checked) for ids, checked in rows]
    assert got.tolist() == want
    ascii_only = [all(agent._pieces.ascii[min(i, agent._pieces.outside)] for i in ids) for ids, _ in rows]
    kinds = {"ascii": sum(ascii_only), "not ascii": len(ascii_only) - sum(ascii_only),
             "found": sum(w > 0 for w in want), "found ascii": sum(w > 0 and a for w, a in zip(want, ascii_only))}
    assert min(kinds.values()) > 50, kinds
    assert len(agent.action_lengths([], [])) == 0


def test_byte_automaton_accepts_where_the_regular_expression_first_matches():
    """The action pattern's automaton (esjax.agent.automaton) reaches ACCEPT at the first byte where the text so far
    holds an ``ACTION`` match, on texts dense in names, brackets, line breaks, case changes and word characters."""
    from esjax.agent.automaton import ACCEPT, START, UNKNOWN, byte_automaton
    from esjax.agent.generate_agent import ACTION, ACTION_NAMES

    table = byte_automaton(ACTION_NAMES)
    rng = np.random.default_rng(3)
    parts = ["search", "click", "SeArCh", "CLICK", "[", "]", "\n", " ", "x", "_", "1", "clic", "searchs", ",", "-",
             " search[", "click[", "CLICK[", "]", " "]
    matched = 0
    for _ in range(3000):
        text = "".join(rng.choice(parts, int(rng.integers(0, 12))))
        state, first = START, 0
        for k, byte in enumerate(text.encode()):
            state = table[state, byte]
            if state == ACCEPT:
                first = k + 1
                break
        want = next((k for k in range(1, len(text) + 1) if ACTION.search(text[:k])), 0)
        assert first == want, text
        matched += want > 0
    assert matched > 200
    assert table[START, "é".encode()[0]] == UNKNOWN and (table[ACCEPT] == ACCEPT).all()


def test_token_automaton_equals_decoding_every_prefix(agent):
    """On the shipped tokenizer: a reply's automaton state is ACCEPT from the first token where decoding the reply
    so far finds an action, and UNKNOWN (the agent is asked instead) once a token that is not ASCII came before."""
    from esjax.agent.automaton import ACCEPT, START, UNKNOWN

    automaton, rng = agent.automaton, np.random.default_rng(4)
    encode = lambda text: agent.tokenizer.encode(text, add_special_tokens=False).ids
    texts = [" search[red shirt, size medium]", " click[buy now]", "Click[Next >]", "search[a] then click[b]",
             "xsearch[no] search[yes]", "search[broken", "click[x\n] click[y]", " search[[nested]]", "]] click[]",
             "thought: fine\nAction: click[< prev]", " click[café]", "é search[x]"]
    noise = encode(" ] [ x click search\n") + sorted(agent.stop_token_ids)
    replies = [encode(t) for t in texts]
    replies += [list(rng.choice(noise, 2)) + replies[int(rng.integers(len(texts)))] + list(rng.choice(noise, 3))
                for _ in range(300)]
    replies = [[int(t) for t in r] for r in replies]
    width = max(map(len, replies))
    tokens = np.array([r + [0] * (width - len(r)) for r in replies])
    states = automaton.advance(np.full(len(replies), START, np.int32), tokens.T).T
    unknown = 0
    for r, ids in enumerate(replies):
        row = states[r, :len(ids)]
        if (row == UNKNOWN).any():
            unknown += 1
            known = row[:np.argmax(row == UNKNOWN)]  # before it the automaton read the reply exactly
            assert not (known == ACCEPT).any() or _by_decoding(agent, ids, 0) == np.argmax(known == ACCEPT) + 1
            continue
        accepted = np.flatnonzero(row == ACCEPT)
        assert (accepted[0] + 1 if len(accepted) else 0) == _by_decoding(agent, ids, 0), agent.decode(ids)
        assert automaton.state_of(ids) == row[-1]
    assert 10 < unknown < len(replies) - 100
