"""Bad input, fuzzed with hypothesis: env actions on every page type, config mutations, corrupt model folders
and corrupt data files. Always a WebShop no-op or a one-line error naming the file/key, never another
exception."""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from reliability import record
from webshop_fixtures import small_dir

from envs.webshop_bridge import DataError, WebShopTextEnv, load_webshop, synthetic_shop
from esjax.config import Config, ConfigError, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[2]
FAST = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# ------------------------------------------------------------------------------------------------ env actions

PAGE_KINDS = ("search", "results", "item", "item_sub", "done")


@pytest.fixture(scope="module")
def shop():
    return synthetic_shop(100, seed=0)


def _goto(env: WebShopTextEnv, kind: str, goal: int) -> None:
    """Put ``env`` on a page of ``kind`` by valid actions."""
    env.reset(goal)
    if kind == "search":
        return
    words = env.instruction.split()
    for q in (env.goal.query, env.goal.name, " ".join(words[2:5]), "a"):
        env.step(f"search[{q}]")
        buttons = {"back to search", "next >", "< prev", "search"}
        products = [c for c in env.available_actions()["clickables"] if c.lower() not in buttons]
        if products:
            break
    if kind == "results":
        return
    env.step(f"click[{products[goal % len(products)].lower()}]")
    if kind == "item":
        return
    if kind == "item_sub":
        env.step("click[description]")
        return
    env.step("click[buy now]")


def test_random_actions_on_every_page_type_are_noops_or_valid(shop):
    stats = {"actions": 0, "invalid": 0, "by_page": dict.fromkeys(PAGE_KINDS, 0)}
    env = WebShopTextEnv(shop, seed=0)
    actions = st.one_of(
        st.text(max_size=40),
        st.builds(lambda name, arg: f"{name}[{arg}]", st.sampled_from(["search", "click", "Click", "buy", ""]),
                  st.text(max_size=30)),
        st.sampled_from(["click[]", "search[]", "[", "]", "click[[x]]", "\n", "][", "click[search]",
                         "click[next >]", "click[< prev]", "click[back to search]", "click[description]",
                         "click[features]", "click[reviews]", "click[attributes]"]),
    )

    @seed(20261202)
    @settings(FAST, max_examples=500)
    @given(kind=st.sampled_from(PAGE_KINDS), goal=st.integers(0, 40), batch=st.lists(actions, min_size=20, max_size=20),
           clicks=st.lists(st.integers(0, 50), min_size=4, max_size=4))
    def check(kind, goal, batch, clicks):
        _goto(env, kind, goal)
        assert env.page.kind == kind
        was_done = kind == "done"
        # Real clickables of the current page (never Buy Now) mixed into the random text.
        for k, i in enumerate(clicks):
            clickables = [c for c in env.available_actions()["clickables"] if c.lower() != "buy now"]
            if clickables:
                batch[k * 5] = f"click[{clickables[i % len(clickables)]}]"
        for action in batch:
            page = env.page.kind
            _, reward, done, info = env.step(action)
            stats["actions"] += 1
            stats["by_page"][page] += 1
            stats["invalid"] += not info.get("valid", True)
            if was_done:
                assert done and reward == 0.0
            else:
                assert not done, (page, action, info)
                assert reward == 0.0

    check()
    assert stats["actions"] >= 10_000 and all(n > 0 for n in stats["by_page"].values())
    record("fuzz-env-actions", area="bad input", fault="random action strings on every page type",
           injection=f"hypothesis: {stats['actions']} actions (random text, name[arg] forms, real clickables except "
                     "Buy Now) on search, results, item, item sub-pages and the done page",
           expected="never raises; never ends the episode (only Buy Now does); invalid actions are no-ops",
           observed=f"{stats['actions']} actions, 0 exceptions, no live episode ended (the done page stays done); "
                    "every page type got actions",
           accepted_lost="n/a", test="tests/config/test_reliability_fuzz.py::"
                                     "test_random_actions_on_every_page_type_are_noops_or_valid")


# ------------------------------------------------------------------------------------------------ configs

def _keys(tree, prefix=()):
    for key, value in tree.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _keys(value, (*prefix, key))


VALID = Config().model_dump(mode="json")
KEYS = list(_keys(VALID))
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=300), st.sampled_from(["synthetic", "hf", "random", "lowrank", "full", "sync", "async", "1e-3",
                                            "/nonexistent", "\x00", "a" * 5000, "~", "."]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@st.composite
def mutations(draw):
    raw = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(KEYS))
        node = raw
        for key in path[:-1]:
            node = node[key] if isinstance(node.get(key), dict) else node.setdefault(key, {})
            if not isinstance(node, dict):
                break
        if not isinstance(node, dict):
            continue
        op = draw(st.sampled_from(["set", "set", "set", "delete", "unknown"]))
        if op == "set":
            node[path[-1]] = draw(VALUES)
        elif op == "delete":
            node.pop(path[-1], None)
        else:
            node[draw(st.text(min_size=1, max_size=8))] = draw(VALUES)
    return raw


def test_config_mutations_give_config_or_one_line_error():
    counts = {"valid": 0, "rejected": 0, "overrides": 0}

    @seed(20261202)
    @settings(FAST, max_examples=1000)
    @given(raw=mutations())
    def check(raw):
        try:
            config_from_dict(raw, "<fuzz>")
            counts["valid"] += 1
        except ConfigError as err:
            message = str(err)
            assert message and "\n" not in message and message.startswith("<fuzz>")
            counts["rejected"] += 1

    @seed(20261202)
    @settings(FAST, max_examples=300)
    @given(key=st.one_of(st.sampled_from([".".join(k) for k in KEYS]), st.text(max_size=20)),
           value=st.text(max_size=40))
    def check_override(key, value):
        counts["overrides"] += 1
        try:
            load_config(None, [f"{key}={value}"])
        except ConfigError as err:
            assert "\n" not in str(err)

    check()
    check_override()
    assert counts["valid"] + counts["rejected"] >= 1000 and counts["rejected"] > 0 and counts["valid"] > 0
    record("fuzz-config", area="bad input", fault="random mutations of a valid config",
           injection=f"hypothesis: {counts['valid'] + counts['rejected']} mutated dicts (1-3 keys set to random "
                     f"values, deleted or unknown keys added) through config_from_dict, and {counts['overrides']} "
                     "random `--set key=value` overrides through load_config",
           expected="a valid Config or a one-line ConfigError naming the source; nothing else",
           observed="every mutation gave a Config or a one-line ConfigError (both seen), every override likewise; "
                    "0 other exceptions",
           accepted_lost="n/a", test="tests/config/test_reliability_fuzz.py::"
                                     "test_config_mutations_give_config_or_one_line_error")


# ------------------------------------------------------------------------------------------------ model folders

def _model_errors():
    from esjax.model.hf import ModelFileError

    return (ModelFileError, ConfigError)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from esjax.agent.policy import EMBEDDED_POLICY_DIR

    if not (EMBEDDED_POLICY_DIR / "config.json").is_file():
        pytest.skip("the embedded policy is not installed")
    return EMBEDDED_POLICY_DIR


def _corrupt(data: bytes, how: str, rng: random.Random) -> bytes:
    if how == "truncate":
        return data[: rng.randrange(0, max(1, len(data)))]
    if how == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
    if how == "flip":  # overwrite a few bytes near the start (the JSON or the safetensors header)
        out = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            if out:
                out[rng.randrange(min(len(out), 256))] = rng.randrange(256)
        return bytes(out)
    if how == "empty":
        return b""
    raise ValueError(how)


def test_corrupt_model_folders_give_one_line_errors_naming_the_file(model_dir, tmp_path):
    from esjax.model.hf import load_pretrained

    files = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    targets = [f for f in files if f in ("config.json", "model.safetensors", "tokenizer.json",
                                         "tokenizer_config.json")]
    outcomes = {"error": 0, "loaded": 0}
    named = 0

    @seed(20261202)
    @settings(FAST, max_examples=60)
    @given(target=st.sampled_from(targets), how=st.sampled_from(["missing", "truncate", "garbage", "flip", "empty"]),
           seed=st.integers(0, 2**16))
    def check(target, how, seed):
        nonlocal named
        folder = tmp_path / "model"
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(model_dir, folder)
        path = folder / target
        original = path.read_bytes()
        if how == "missing":
            path.unlink()
        else:
            path.write_bytes(_corrupt(original, how, random.Random(seed)))
        try:
            load_pretrained(folder)
            # only damage that leaves a valid folder may load: a flipped byte inside a string, a cut that took
            # trailing whitespace only, or no tokenizer_config.json (optional); a truncated, emptied, missing or
            # garbage weights file never loads
            left = path.read_bytes() if path.exists() else b""
            assert how == "flip" or (how == "missing" and target == "tokenizer_config.json") or (
                how == "truncate" and target != "model.safetensors" and not original[len(left):].strip()), (
                f"{target} {how}: loaded")
            outcomes["loaded"] += 1
        except _model_errors() as err:
            message = str(err)
            assert "\n" not in message, message
            assert target in message, message
            named += 1
            outcomes["error"] += 1

    check()
    assert outcomes["error"] > 0
    record("fuzz-model-folders", area="bad input",
           fault="missing / truncated / garbage / byte-flipped config.json, model.safetensors, tokenizer files",
           injection=f"hypothesis: {sum(outcomes.values())} corrupted copies of the embedded HF policy folder "
                     "through load_pretrained",
           expected="a one-line CheckpointError naming the file (or a successful load when the file is still valid)",
           observed="every corrupted folder gave a one-line CheckpointError naming the corrupted file, or loaded "
                    "when the damage left a valid file; 0 other exceptions",
           accepted_lost="n/a",
           test="tests/config/test_reliability_fuzz.py::test_corrupt_model_folders_give_one_line_errors_naming_the_file")


# ------------------------------------------------------------------------------------------------ data files

def test_corrupt_data_files_give_data_errors_naming_file_and_field(tmp_path):
    """The real small set's files (../shared/webshop_small, else the packaged copy: tests/webshop_fixtures.py)."""
    SMALL = small_dir()
    lines = (SMALL / "products_1000.jsonl").read_text().splitlines()[:30]
    raw_products = [json.loads(line)["product"] for line in lines]
    attrs_text = (SMALL / "items_ins_v2_1000.json").read_text()
    outcomes = {"error": 0, "loaded": 0, "field": 0}

    @seed(20261202)
    @settings(FAST, max_examples=60)
    @given(fmt=st.sampled_from(["jsonl", "raw"]), how=st.sampled_from(["truncate", "drop_field", "wrong_type",
                                                                      "attrs_truncate", "not_a_list"]),
           seed=st.integers(0, 2**16))
    def check(fmt, how, seed):
        rng = random.Random(seed)
        folder = tmp_path / "data"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        records = copy.deepcopy(raw_products) if fmt == "raw" else [json.loads(line) for line in lines]
        victim = records[rng.randrange(len(records))]
        product = victim if fmt == "raw" else victim["product"]
        if how == "drop_field":
            product.pop(rng.choice(sorted(product)))
        elif how == "wrong_type":
            product[rng.choice(sorted(product))] = rng.choice([17, None, [1, 2], {"x": 1}, 2.5])
        text = ("\n".join(json.dumps(r) for r in records) if fmt == "jsonl" else json.dumps(records))
        if how == "not_a_list":
            text = json.dumps({"products": records}) if fmt == "raw" else "[1, 2, 3]"
        name = "products_x.jsonl" if fmt == "jsonl" else "items_shuffle_x.json"
        if how == "truncate":
            text = text[: rng.randrange(1, len(text))]
        (folder / name).write_text(text)
        attrs = attrs_text[: rng.randrange(1, len(attrs_text))] if how == "attrs_truncate" else attrs_text
        (folder / "items_ins_v2_x.json").write_text(attrs)
        try:
            load_webshop(folder)
            # only a dropped or mistyped optional field, or a cut at a record boundary of the .jsonl, may load
            whole = "\n".join(json.dumps(r) for r in records)
            at_boundary = fmt == "jsonl" and how == "truncate" and whole[len(text)] == "\n"
            assert how in ("drop_field", "wrong_type") or at_boundary, f"{fmt} {how}: loaded"
            outcomes["loaded"] += 1
        except DataError as err:
            message = str(err)
            assert "\n" not in message and (name in message or "items_ins_v2_x.json" in message), message
            outcomes["error"] += 1
            outcomes["field"] += err.field is not None

    check()
    assert outcomes["error"] > 0
    record("fuzz-data-files", area="bad input",
           fault="truncated JSON, missing or mistyped fields in WebShop data files",
           injection=f"hypothesis: {outcomes['error'] + outcomes['loaded']} corrupted copies of 30 real products "
                     "(processed .jsonl and raw items_shuffle .json) and of items_ins_v2, through load_webshop",
           expected="DataError naming the file (and record/field where there is one), one line; or a load when "
                    "the dropped field is optional",
           observed="every corrupted copy gave a one-line DataError naming the file (and the field, where one "
                    "was at fault), or loaded when only an optional field was hit; 0 other exceptions",
           accepted_lost="n/a",
           test="tests/config/test_reliability_fuzz.py::test_corrupt_data_files_give_data_errors_naming_file_and_field")
