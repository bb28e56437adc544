"""Generate mode (``agent.mode: generate``): the policy writes each WebShop action.

* action parsing and the invalid-action feedback of :mod:`esjax.agent.generate_agent`;
* decode lanes (:mod:`esjax.agent.lanes`): greedy generation equals ``esjax.agent.batch_generate.generate``, also
  when rows join a lane at different decode steps and the cache is shifted; per-row ES members (low-rank and
  full) equal generation with explicitly perturbed parameters (``esjax.es.noise.perturbed_params``) on a tiny
  random HF model loaded back from disk;
* the engine (:mod:`esjax.loop.generate_rollout`) on the packaged real WebShop data: episodes are deterministic, every
  member of a version draws from the same sampling stream (common random numbers), invalid actions are
  WebShop's no-op and are counted;
* the trainer: resuming from every checkpoint is bit-identical (θ, metrics records, evaluation traces with
  every sampled reply), and ``python -m esjax.run --config configs/generate-tiny.yaml`` runs end to end.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from esjax.agent.batch_generate import generate
from esjax.agent.generate_agent import GenerateAgent
from esjax.agent.lanes import PREFILL_BUCKETS, Lane, RowState, Sampling, generate_rows, split_seed
from esjax.es.noise import NoiseSpec, perturbed_params
from esjax.model.params import init_params
from esjax.model.testing import tiny_config

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ the agent
class _WordTokenizer:
    """Enough of a tokenizer for parsing tests."""

    def get_vocab(self):
        return {"]": 0, "a": 1}


def test_parse_takes_the_first_action_in_webshop_grammar():
    agent = GenerateAgent(_WordTokenizer())
    assert agent.closing_ids == frozenset({0})
    assert agent.parse("search[Red Shirt]") == ("search[Red Shirt]", "search[Red Shirt]", True)
    assert agent.parse("Thought: cheap one.\nAction: Click[B01 XYZ] and more")[1:] == ("click[B01 XYZ]", True)
    assert agent.parse("Thought: x\nAction: click[buy now]\n")[0] == "Thought: x\nAction: click[buy now]"
    # arguments as written, as WebShop takes them: `search[ ]` searches for ' ', `click[ buy now ]` is not Buy Now
    assert agent.parse("search[ ]")[1:] == ("search[ ]", True)
    assert agent.parse("Action: click[ buy now ]")[1:] == ("click[ buy now ]", True)
    reply, action, parsed = agent.parse("I would buy it\nsecond line")
    assert (action, parsed) == ("I would buy it", False)  # sent as it is: the env's no-op
    assert agent.complete("click[next >]") and not agent.complete("click[next >")


def test_invalid_action_feedback_reaches_the_next_prompt():
    agent = GenerateAgent(_WordTokenizer())
    memory = agent.new_memory("find a red shirt")
    agent.remember(memory, "blah", "blah", {"valid": False, "invalid_reason": "not of the form search[...]"})
    text = agent.prompt_text("WebShop [SEP] Search", {"has_search_bar": True, "clickables": ["search"]}, memory)
    assert "was invalid (not of the form search[...])" in text and "search[<query>]" in text
    assert "click[search]" not in text
    agent.remember(memory, "search[red shirt]", "search[red shirt]", {"valid": True})
    text = agent.prompt_text("results", {"clickables": ["b01", "next >"]}, memory)
    assert "invalid" not in text and "click[b01], click[next >]" in text and "blah ; search[red shirt]" in text


# ------------------------------------------------------------------------------------------------ decode lanes
@pytest.fixture(scope="module")
def tiny():
    config = tiny_config()
    return config, init_params(config, jax.random.key(0))


PROMPTS = [[3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13], [5], list(range(20, 37))]


@pytest.mark.parametrize("steps", [1, 3])
def test_lane_greedy_equals_generate(tiny, steps):
    config, params = tiny
    want = generate(config, params, PROMPTS, max_new_tokens=10, stop_token_ids=[])
    got = generate_rows(config, params, PROMPTS, max_new_tokens=10, greedy=[True] * len(PROMPTS), steps=steps)
    assert got == want


def test_rows_joining_at_different_steps_with_shifts(tiny):
    """Rows enter a short lane at different decode steps; the cache shifts several times; each row still
    generates what it generates alone."""
    config, params = tiny
    prompts = PROMPTS + PROMPTS[::-1]
    want = generate(config, params, prompts, max_new_tokens=12, stop_token_ids=[])
    lane = Lane(config, 2, PREFILL_BUCKETS.length(17) + 12 + 2, params["embed"]["embedding"].dtype, Sampling())
    out: dict = {}
    queue = list(range(len(prompts)))
    shifts = 0
    while queue or len(lane.live_rows()):
        entries = []
        while queue and len(lane.live_rows()) + len(entries) < 2:
            r = queue.pop(0)
            slot = lane.free_row()
            entries.append((slot, prompts[r], RowState((0, 0, False), *split_seed(r), True)))
            out[slot] = out.get(slot, [])
            out[(slot, "row")] = r
        before = lane.index
        first = lane.prefill(params, None, 0.0, entries, 2)
        if first is not None:
            for (slot, _, _), token in zip(entries, np.asarray(first)):
                out[slot] = [int(token)]
        tokens = np.asarray(lane.decode(params, None, 0.0, 2))
        shifts += lane.index < before + 2
        for slot in lane.live_rows().tolist():
            out[slot].extend(int(t) for t in tokens[slot])
            if len(out[slot]) >= 12:
                assert out[slot][:12] == want[out[(slot, "row")]]
                lane.release(slot)
    assert shifts >= 1


def test_lanes_find_turn_ends_as_the_host_does(tiny):
    """With a turn automaton on the device, every decode call returns its block of tokens (the fed one where the row
    was just prefilled, the hole elsewhere; then the sampled ones) and where each turn ends in it, equal to the
    host's table walk from the states passed in and :func:`turn_ends` over it on the host."""
    from esjax.agent.automaton import LOOK, ActionAutomaton, TurnAutomaton, turn_ends
    from esjax.agent.lanes import decoded_parts

    config, params = tiny
    rng = np.random.default_rng(0)
    ids = config.vocab_size
    action = ActionAutomaton(rng.integers(0, 7, (7, ids + 1)).astype(np.int32))
    automaton = TurnAutomaton(action, stop_ids=[5], closing_ids=[9, 10], ids=ids)
    events = automaton.events(max_new_tokens=9)
    lane = Lane(config, 4, PREFILL_BUCKETS.length(17) + 40, params["embed"]["embedding"].dtype,
                Sampling(temperature=1.0), jax.numpy.asarray(automaton.table), events)
    states = rng.integers(0, automaton.width, lane.rows).astype(np.int32)
    looked = 0
    for call in range(6):
        entries = [(lane.free_row(), PROMPTS[(call + r) % 4], RowState((0, 0, False), *split_seed(call + r), False,
                                                                        count=r)) for r in range(2 if call < 2 else 0)]
        lane.prefill(params, None, 0.0, entries, 3)
        fresh = np.isin(np.arange(lane.rows), [slot for slot, _, _ in entries])
        counts = lane.row["count"].copy()
        block, ends = decoded_parts(np.asarray(lane.decode(params, None, 0.0, 3, states)))
        assert (block[0, ~fresh] == automaton.hole).all()
        walk = automaton.advance(states, block).T
        want = np.asarray(turn_ends(walk, counts, lane.row["live"], events))
        assert (ends == want).all(), call
        looked += int(np.count_nonzero(ends[2] >= LOOK))
        states = ends[0]
    assert looked and len(set(walk.ravel().tolist())) > 3  # turns ended, the walk went through several states


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory):
    pytest.importorskip("torch")
    from esjax.agent.policy import load_policy
    from esjax.model.testing import make_hf_checkpoint

    path = tmp_path_factory.mktemp("tiny-hf")
    make_hf_checkpoint(path, "qwen2", tied=False, vocab_size=128, hidden_size=32, intermediate_size=48)
    return load_policy("hf", str(path))


#: Words of the action tokenizer: whole actions ("search[shirt]"), action heads and tails, page words. A random
#: model writing these ends its replies after a random number of tokens (a complete action or <|im_end|>), so
#: rows fall out of step and checkpoints catch replies in progress.
_WORDS = ["red", "blue", "green", "shirt", "pants", "size", "large", "small", "cotton", "pillow", "price", "dollars",
          "buy", "now", "next", "back", "to"]
ACTION_WORDS = ([f"search[{w}]" for w in _WORDS] + [f"click[{w}]" for w in _WORDS] + ["click[next >]", "shirt]",
                "search[", "click[", "[SEP]"] + _WORDS
                + ["search", "page", "results", "instruction:", "observation:", "available", "actions:", "reply",
                   "with", "the", "action", "only", "find", "me", "and", "lower", "than", "color:", "item", "you",
                   "are"])


def _action_checkpoint(path: Path) -> Path:
    """A tiny random HF Qwen2 checkpoint whose word-level vocabulary holds WebShop actions (see ACTION_WORDS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from esjax.model.testing import make_hf_checkpoint

    make_hf_checkpoint(path, "qwen2", tied=False, vocab_size=128, hidden_size=32, intermediate_size=48)
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = list(dict.fromkeys(specials + ACTION_WORDS))
    assert len(words) <= 128
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def action_policy(tmp_path_factory):
    pytest.importorskip("torch")
    from esjax.agent.policy import load_policy

    return load_policy("hf", str(_action_checkpoint(tmp_path_factory.mktemp("action-hf"))))


@pytest.mark.parametrize("mode", ["lowrank", "full"])
def test_member_rows_equal_explicitly_perturbed_params(hf_policy, mode):
    config, params = hf_policy.config, hf_policy.params
    spec = NoiseSpec(seed=3, mode=mode, rank=1)
    sigma = 0.5
    members = [(0, 0, True), (0, 1, True), (2, 5, True), (0, 0, False)]
    prompts = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 10, 11], [5, 6, 7, 8]]
    sampling = Sampling(temperature=1.0, top_p=0.95, top_k=40)
    seeds = [11, 11, 12, 11]
    got = generate_rows(config, params, prompts, noise=spec, sigma=sigma, members=members, max_new_tokens=8,
                        sampling=sampling, seeds=seeds)
    for r, (version, index, active) in enumerate(members):
        theta = perturbed_params(spec, params, version, index, sigma) if active else params
        alone = generate_rows(config, theta, [prompts[r]], max_new_tokens=8, sampling=sampling, seeds=[seeds[r]])
        assert got[r] == alone[0], (mode, r)
    assert got[0] != got[1] and got[0] != got[3]  # members differ (antithetic pair, unperturbed)


# ------------------------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def shop():
    from envs.webshop_bridge import PACKAGED_DATA, load_webshop

    if "webshop_small" not in PACKAGED_DATA:
        pytest.skip("the packaged WebShop data is not available")
    return load_webshop("webshop_small")


def _engine(shop, policy, rows=4, sigma=0.0, spec=None, max_steps=3, temperature=1.0, steps=2, unperturbed_turns=0,
            max_new_tokens=6):
    from envs.webshop_bridge import InProcessEnvPool
    from envs.webshop_bridge.task import generate_agent
    from esjax.config import load_config
    from esjax.loop.generate_rollout import GenerateEngine

    config = load_config(None, ["agent.mode=generate", "agent.max_prompt_tokens=256"])
    agent = generate_agent(policy, config.agent)
    return GenerateEngine(InProcessEnvPool(shop, rows), agent, policy.config, spec or NoiseSpec(seed=0, rank=1),
                          lambda v: sigma, max_steps, Sampling(temperature, 0.9, 20), max_new_tokens=max_new_tokens,
                          decode_steps=steps, max_prompt_tokens=256, unperturbed_turns=unperturbed_turns)


def _run(engine, starts, params):
    for kwargs in starts:
        engine.start(**kwargs)
    done = []
    while engine.live:
        finished, _ = engine.tick(lambda v: params)
        done += finished
    return {(e.kind, e.owner, e.position): (e.trace, e.invalid_actions, e.reward) for e in done}


def _member(index, position=0, seed=99, version=0, kind="train", greedy=False):
    return dict(kind=kind, owner=index, version=version, index=index, goal=1500 + position, position=position,
                sampling_seed=seed, greedy=greedy)


def _take_one_by_one(engine, tokens: list[int], new: list[int]) -> None:
    """The turn's intake as specified: token by token until the turn is over (a stop token, ``max_new_tokens``, or
    a closing token after which the reply's text holds a complete action, marked by ``-1``)."""
    agent = engine.agent
    for token in new:
        if tokens and (tokens[-1] == -1 or tokens[-1] in agent.stop_token_ids or len(tokens) >= engine.max_new_tokens):
            break
        tokens.append(token)
        if token in agent.closing_ids and agent.complete(agent.decode(tokens)):
            tokens.append(-1)


def _check_block_intake(engine, start: list[list[int]], new: np.ndarray, taking: np.ndarray,
                        rng: np.random.Generator) -> dict[str, int]:
    """Take block ``new [rows, n]`` into the turns holding ``start`` of the rows ``taking``, half of them (at
    random) first taking a prefill's token (the block's first token, a hole in the others' first step); assert
    every such row ends with what per-token intake gives, and return how many turns ended which way."""
    from esjax.agent.automaton import turn_ends
    from esjax.loop.generate_rollout import TurnTokens

    turn = TurnTokens(len(start), 2 * (engine.max_new_tokens + new.shape[1] + 1), engine.automaton.hole)
    for r, tokens in enumerate(start):
        turn.put(r, SimpleNamespace(tokens=tokens, row=r), engine.automaton.state_of(tokens))
    prefilled = (rng.random(len(start)) < 0.5) & taking  # as in a lane: a prefilled row is live
    block = np.concatenate([np.where(prefilled, new[:, 0], engine.automaton.hole)[None], new[:, 1:].T])
    states = engine.automaton.advance(turn.state, block).T  # as the decode program walks it
    where = turn_ends(states, turn.count + prefilled, taking, engine.automaton.events(engine.max_new_tokens))
    ended = engine._take_block(turn, block, np.asarray(where))
    stopped = turn.state == engine.automaton.stopped
    over = (turn.complete | (turn.count >= engine.max_new_tokens) | stopped) & taking
    assert ended.tolist() == np.flatnonzero(over).tolist()
    ends = {"stop or length": 0, "complete action": 0, "going on": 0}
    for r in np.flatnonzero(taking).tolist():
        tokens = list(start[r])
        _take_one_by_one(engine, tokens, new[r, 0 if prefilled[r] else 1:].tolist())
        assert turn.get(r) == tokens, r
        ends["going on" if not over[r] else "complete action" if tokens[-1] == -1 else "stop or length"] += 1
    return ends


def test_block_token_intake_equals_taking_tokens_one_by_one(shop, action_policy):
    """A decode call's tokens go into the turns as array operations: every row ends with exactly what per-token
    intake gives (stop and closing tokens, complete actions, max_new_tokens reached mid-block, turns already
    holding tokens). This tokenizer is not byte-level: the automaton reads nothing and the agent is asked at
    every closing token."""
    engine = _engine(shop, action_policy, steps=4)
    agent, rng = engine.agent, np.random.default_rng(0)
    plain = [t for t in range(engine.model_config.vocab_size) if t not in agent.stop_token_ids | agent.closing_ids]
    special = sorted(agent.closing_ids | agent.stop_token_ids)
    vocab = [*plain[:60], *special[:6]]
    ends = dict.fromkeys(("stop or length", "complete action", "going on"), 0)
    for _ in range(20):
        rows, n = 16, int(rng.integers(1, 6))
        start = [[int(t) for t in rng.choice(plain[:60], int(rng.integers(0, engine.max_new_tokens)))]
                 for _ in range(rows)]
        new, taking = rng.choice(vocab, (rows, n + 1)).astype(np.int32), rng.random(rows) < 0.8
        for way, count in _check_block_intake(engine, start, new, taking, rng).items():
            ends[way] += count
    assert min(ends.values()) > 5, ends  # every way a turn ends (or not) was taken


def test_block_token_intake_with_the_action_automaton(shop):
    """The same on the shipped byte-level tokenizer, where the action automaton finds complete actions (replies
    with a token that is not ASCII go to the agent): replies cut anywhere from real actions, noise around them."""
    from esjax.agent.policy import load_policy
    from esjax.config import load_config

    config = load_config(REPO / "configs" / "generate.yaml")
    policy = load_policy(config.model.source, embedded=config.model.embedded)
    engine = _engine(shop, policy, steps=4, max_new_tokens=24)
    agent, rng = engine.agent, np.random.default_rng(1)
    encode = lambda text: agent.tokenizer.encode(text, add_special_tokens=False).ids
    replies = [encode(t) for t in (" search[red shirt, size medium]", " click[buy now]", "Click[Next >]",
                                   "search[a] then click[b]", "xsearch[no] search[yes]", "search[broken",
                                   "click[x\n] click[y]", " search[[nested]]", " click[caf\u00e9 cr\u00e8me]",
                                   "\u00e9search[x] click[y]", "thought: fine\nAction: click[< prev]")]
    words = encode(" ] [ x click search\n")
    noise = words + sorted(agent.stop_token_ids)
    ends = dict.fromkeys(("stop or length", "complete action", "going on"), 0)
    for _ in range(30):
        rows, n = 16, int(rng.integers(1, 9))
        start, new = [], np.zeros((rows, n), np.int32)
        for r in range(rows):
            reply = replies[int(rng.integers(len(replies)))]
            reply = [int(t) for t in rng.choice(words, int(rng.integers(0, 2)))] + reply  # a live turn: no stop yet
            cut = int(rng.integers(0, len(reply) + 1))
            while cut and agent.complete(agent.decode(reply[:cut])):  # a turn holding an action has ended
                cut -= 1
            rest = reply[cut:] + [int(t) for t in rng.choice(noise, n)]
            start.append(reply[:cut][:engine.max_new_tokens - 1])
            new[r] = rest[:n]
        for way, count in _check_block_intake(engine, start, new, rng.random(rows) < 0.8, rng).items():
            ends[way] += count
    assert min(ends.values()) > 5, ends


def test_episodes_are_deterministic_and_members_share_the_sampling_stream(shop, action_policy):
    hf_policy = action_policy
    starts = [_member(0), _member(1), _member(2, seed=7), _member(0, kind="eval", greedy=True)]
    params = hf_policy.params
    first = _run(_engine(shop, hf_policy), starts, params)
    again = _run(_engine(shop, hf_policy), starts, params)
    assert first == again
    # sigma 0: members 0 and 1 of one version run the same parameters with the same keys -> the same replies;
    # another sampling seed (another version's task batch) draws other tokens
    assert first[("train", 0, 0)] == first[("train", 1, 0)]
    assert first[("train", 2, 0)][0] != first[("train", 0, 0)][0]
    from esjax.loop.generate_rollout import turn_seed

    assert turn_seed(99, 0, 1) != turn_seed(99, 0, 2) != turn_seed(99, 1, 1)
    # with noise, the two members differ through their parameters only
    noisy = _run(_engine(shop, hf_policy, sigma=0.5), starts[:2], params)
    assert noisy[("train", 0, 0)][0] != noisy[("train", 1, 0)][0]


def test_unperturbed_first_turns_are_the_versions_own_and_later_turns_the_members(shop, action_policy):
    """``unperturbed_turns=1``: every training member writes its first turn with θ itself (the same reply as the
    unperturbed policy under the same keys), and its member applies from the second turn on."""
    starts = [_member(i) for i in range(4)]
    params = action_policy.params

    def engine(sigma, unperturbed):
        return _engine(shop, action_policy, rows=4, sigma=sigma, unperturbed_turns=unperturbed)

    centre = _run(engine(0.0, 0), starts, params)
    perturbed = _run(engine(0.5, 0), starts, params)
    first_fixed = _run(engine(0.5, 1), starts, params)
    firsts = lambda runs: [runs["train", i, 0][0][0] for i in range(4)]
    assert firsts(first_fixed) == firsts(centre)
    assert firsts(perturbed) != firsts(centre)  # σ 0.5 changes first turns when they are perturbed
    later = lambda runs: [runs["train", i, 0][0][1:] for i in range(4)]
    assert later(first_fixed) != later(centre)  # the members act from the second turn on


def test_invalid_actions_are_noops_and_counted(shop, hf_policy):
    engine = _engine(shop, hf_policy, rows=2)
    episode = engine.start(**_member(0))
    page = episode.observation
    done = []
    while engine.live:
        done += engine.tick(lambda v: hf_policy.params)[0]
    (ep,) = done
    assert ep.steps == 3 and ep.reward == 0.0
    assert ep.invalid_actions == 3  # the random model never writes search[...] / click[...]
    assert ep.observation == page  # WebShop's no-op: still the search page
    assert "was invalid" in engine.agent.prompt_text(ep.observation, ep.available, ep.memory)
    # a valid action written by the model moves the env and is not counted
    engine = _engine(shop, hf_policy, rows=1)
    episode = engine.start(**_member(0))
    reply, action, parsed = engine.agent.parse("Action: Search[red shirt]")
    engine._acted(episode, reply, action, {"valid": True}, {"has_search_bar": False, "clickables": ["next >"]})
    assert parsed and episode.invalid_actions == 0 and episode.trace == [("Action: Search[red shirt]",
                                                                         "search[red shirt]")]


def test_greedy_evaluation_reports_the_invalid_action_rate(shop, hf_policy):
    from envs.webshop_bridge import InProcessEnvPool
    from envs.webshop_bridge.task import generate_agent
    from esjax.config import load_config
    from esjax.train.standalone_eval import evaluate_policy

    agent = generate_agent(hf_policy, load_config(None, ["agent.mode=generate", "agent.max_prompt_tokens=256"]).agent)
    res = evaluate_policy(hf_policy.config, hf_policy.params, agent, functools.partial(InProcessEnvPool, shop),
                          [1500, 1501], max_steps=2,
                          max_new_tokens=4)
    assert res["score"] == 0.0 and res["invalid_action_rate"] == 1.0  # the random model never writes an action
    # each episode runs both turns and no reply holds an action, so a turn ends at max_new_tokens or an end token
    tokens = res["tokens_per_episode"]
    assert 2 <= tokens["generated"] <= 2 * 4 and tokens["prompt"] > 2 * tokens["generated"]


# ------------------------------------------------------------------------------------------------ the trainer
BASE = ["run.progress=false", "run.plots=false", "run.updates=3", "run.eval_every=2", "run.checkpoint_every=1",
        "run.keep_checkpoints=100", "es.population=4", "es.rank=1", "es.sigma=0.05", "es.learning_rate=0.01",
        "es.scale=nes", "schedule.slots=3",
        "schedule.max_lag=1", "env.data=webshop_small", "env.tasks_per_member=2", "env.max_steps=3",
        "env.eval_goals=3", "agent.mode=generate", "agent.temperature=1.0", "agent.top_p=0.95", "agent.top_k=50",
        "agent.max_new_tokens=6", "agent.max_prompt_tokens=192", "agent.decode_steps=2"]


def test_stale_members_generate_with_their_own_versions_parameters(tmp_path, monkeypatch):
    """Generate mode: every decode call of a version's lane gets θ_v (checked against θ_v as the update made it) and
    σ_v, also for rows whose version has been superseded (controlled staleness: half of each cohort at t - 1)."""
    from conftest import reward_by_trace, theta_moved
    from run_settings import es_config_of
    from test_trainer import ThetaHistory, _digest

    from esjax.config import load_config
    from esjax.loop.generate_rollout import GenerateEngine
    from esjax.train.session import train

    theta = ThetaHistory()
    reward_by_trace(monkeypatch, GenerateEngine)
    calls = []
    decode = Lane.decode

    def recording(self, params, noise, sigma, steps, prefilled):
        versions = set(self.row["version"][self.row["live"] & self.row["perturbed"]].tolist())
        if versions:
            calls.append((versions, float(sigma), _digest(params), theta.current))
        return decode(self, params, noise, sigma, steps, prefilled)

    monkeypatch.setattr(Lane, "decode", recording)
    model = _action_checkpoint(tmp_path / "model")
    config = load_config(None, [*BASE, "model.source=hf", f"model.path={model}", "run.eval_every=3",
                                "run.checkpoint_every=3", "schedule.kind=controlled", "schedule.lag=1",
                                "schedule.stale_fraction=0.5", "es.sigma_schedule=linear", "es.sigma_final=0.01"])
    result = train(config, run_dir=tmp_path / "run", hooks=theta.hooks)
    history = theta.digests
    assert theta_moved(result.records) and len(set(history.values())) == 4
    sigma_at = es_config_of(config).sigma_at
    for versions, sigma, digest, current in calls:
        (v,) = versions  # one lane per version
        assert digest == history[v], f"rows of version {v} generated with another θ (current version {current})"
        assert sigma == pytest.approx(float(sigma_at(v)), rel=1e-6), (v, sigma)
    assert any(v < current for (v,), _, _, current in calls), "no stale row: nothing was checked"


@pytest.mark.parametrize("constrain", ["none", "all"])
def test_resume_in_generate_mode_is_bit_identical(tmp_path, monkeypatch, constrain):
    """A run killed right after any checkpoint and resumed ends with the same θ, records and traces. Every
    checkpoint lands with turns in progress (partial replies), so the re-prefill path is exercised (with
    ``constrain: all``, also the re-derivation of which choices a partial reply still matches)."""
    from conftest import reward_by_trace, theta_moved
    from run_settings import checkpoint_steps, read_records, resumes_are_bit_identical

    from esjax.config import load_config
    from esjax.loop.generate_rollout import GenerateEngine
    from esjax.rundir.checkpoint import read_loop_state
    from esjax.rundir.metrics import untimed
    from esjax.train.session import train

    # the random model never buys: WebShop's reward would be 0 for every member and θ would never move, so
    # same_bits below would pass whatever θ a resume used; a reward drawn from the replies makes θ move
    reward_by_trace(monkeypatch, GenerateEngine)
    model = _action_checkpoint(tmp_path / "model")
    # constrained searches copy up to max_new_tokens words: longer turns, so checkpoints catch one in progress
    longer = ["agent.max_new_tokens=12"] if constrain != "none" else []
    base = [*BASE, "model.source=hf", f"model.path={model}", f"agent.constrain={constrain}", *longer]
    reference = train(load_config(None, base), run_dir=tmp_path / "reference")
    records = untimed(read_records(reference.run_dir))
    assert theta_moved(records)
    assert [r["version"] for r in records if r["kind"] == "eval"] == [0, 2, 3]
    assert reference.version == 3
    assert all(r["invalid_actions"] > 0 for r in records if r["kind"] in ("update", "eval"))
    steps = checkpoint_steps(reference.run_dir)
    partial = [s for s in steps[:-1] if any(e["partial"] for e in read_loop_state(reference.run_dir, s)["episodes"])]
    assert partial, "no checkpoint caught a reply in progress: the test would not exercise the re-prefill"
    # from every checkpoint once (free replies); constrained, from the first that holds a reply in progress
    resumes_are_bit_identical(reference, records, tmp_path, None if constrain == "none" else partial[:1])


def test_resume_of_generate_yaml_is_bit_identical_with_webshops_own_reward(tmp_path):
    """configs/generate.yaml's policy earns WebShop's real reward, so θ moves without any patched reward; a run
    killed after a checkpoint and resumed still ends bit-identical (θ, records, traces). Resumes from every
    checkpoint are the free-reply test's (above); here from the middle one."""
    from conftest import theta_moved
    from run_settings import read_records, resumes_are_bit_identical

    from esjax.config import load_config
    from esjax.rundir.metrics import untimed
    from esjax.train.session import train

    small = ["run.updates=3", "run.eval_every=2", "run.checkpoint_every=1", "run.keep_checkpoints=100",
             "run.progress=false", "run.plots=false", "es.population=4", "schedule.slots=3",
             "env.tasks_per_member=4", "env.eval_goals=2", "env.max_steps=6", "agent.decode_steps=2"]
    reference = train(load_config(REPO / "configs" / "generate.yaml", small), run_dir=tmp_path / "reference")
    records = untimed(read_records(reference.run_dir))
    assert theta_moved(records)
    assert any(r["fitness_max"] > 0 for r in records if r["kind"] == "update")  # a real purchase's reward
    resumes_are_bit_identical(reference, records, tmp_path, [2])


def test_cli_runs_generate_tiny_end_to_end(tmp_path, capsys):
    """``python -m esjax.run --config configs/generate-tiny.yaml``, in this process (the CLI as its own process:
    tests/config/test_config.py::test_cli_exits_with_one_line_and_no_traceback)."""
    from esjax.cli.common import run_cli
    from esjax.cli.run import main

    with pytest.raises(SystemExit) as info:
        run_cli(main, ["--config", str(REPO / "configs" / "generate-tiny.yaml"), "--set", "run.updates=2", "--set",
                       "run.progress=false", "--run-dir", str(tmp_path / "run")])
    assert info.value.code == 0, capsys.readouterr().err[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records if r["kind"] == "update"] == [1, 2]
    assert records[-1]["kind"] == "end"
    assert all("invalid_actions" in r for r in records if r["kind"] in ("update", "eval"))


def test_generate_yaml_runs_and_moves_theta(tmp_path, capsys):
    """``configs/generate.yaml`` (the embedded generative policy) end to end in a few small updates: the policy
    writes actions WebShop accepts and each update moves θ."""
    from esjax.cli.common import run_cli
    from esjax.cli.run import main

    small = ["run.updates=2", "run.eval_every=2", "run.progress=false", "run.plots=false", "es.population=4",
             "schedule.slots=4", "env.tasks_per_member=4", "env.eval_goals=2", "env.max_steps=6"]
    with pytest.raises(SystemExit) as info:
        run_cli(main, ["--config", str(REPO / "configs" / "generate.yaml"), *[a for s in small for a in ("--set", s)],
                       "--run-dir", str(tmp_path / "run")])
    assert info.value.code == 0, capsys.readouterr().err[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if r["kind"] == "update"]
    assert [r["version"] for r in updates] == [1, 2] and all(r["update_norm"] > 0 for r in updates)
    assert any(r["fitness_max"] > 0 for r in updates)  # some member bought something worth a reward
