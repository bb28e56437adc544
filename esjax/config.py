"""Run configuration: YAML files validated into typed objects before anything compiles.

Every user mistake (unknown key, wrong type, impossible combination, missing model folder) becomes a
:class:`ConfigError` whose one-line message names the file, the dotted key and what was expected, so the
CLI can print it and exit non-zero without a traceback:

* types are strict: no string → number, bool → int or float → int coercion (``updates: '12'``,
  ``updates: true`` and ``population: 8.0`` are errors); floats must be finite; sizes have upper bounds;
* YAML is read as YAML 1.2 numbers (``1e-3`` is a float, not a string), duplicated keys are errors, and
  so are an empty file, bytes that are not UTF-8 and an ``extends:`` naming a missing file;
* a key inherited through ``extends:`` is blamed on the file that set it; a ``--set`` override on itself;
* regular expressions are compiled and schedule parameter combinations checked here, before anything runs;
* a section that selects a kind (``schedule``, ``es.optimizer``) is a discriminated union on ``kind``: each kind
  is its own model with only its keys, so a key of another kind is an error naming it and the kinds that have it
  (and the JSON schema, ``Config.model_json_schema()``, shows each kind's keys).

The ``es`` defaults are the library's (:class:`esjax.es.ESConfig`, :class:`esjax.es.NoiseSpec`): one set of values.

One module (~700 lines): the sections are the schema of one file format, and the loading, overriding and error
reporting above serve them all.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from esjax.errors import EsjaxError
from esjax.es.step import ESConfig

MAX_SEED = 2**32 - 1
Patterns = Annotated[tuple[str, ...], Field(strict=False)]  # a YAML list becomes the tuple


class ConfigError(EsjaxError, ValueError):
    """A configuration problem a user can fix; the message is one line and names the key."""


def _path_problem(text: str, want: str) -> str | None:
    """Why ``text`` is not an existing ``want`` ('dir', 'file' or 'any') path, or None if it is one.

    Odd paths (a NUL byte, a name too long for the OS, ``~unknownuser``) are "not found", never an exception."""
    try:
        path = Path(text).expanduser()
        ok = path.is_dir() if want == "dir" else path.is_file() if want == "file" else path.exists()
    except (OSError, ValueError, RuntimeError) as err:
        return f"is not a usable path ({err.__class__.__name__})"
    return None if ok else "does not exist"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class RunSection(_Section):
    """What the job is: seed, length, cadence of evaluation and checkpoints, where it writes."""

    name: str = "esjax"
    seed: int = Field(0, ge=0, le=MAX_SEED)
    updates: int = Field(20, ge=1, le=10_000_000, description="number of ES updates to apply")
    eval_every: int = Field(10, ge=1, le=10_000_000, description="evaluate the unperturbed policy every E updates")
    checkpoint_every: int = Field(5, ge=1, le=10_000_000,
                                  description="orbax checkpoint every C updates (and at the end)")
    checkpoint_minutes: float | None = Field(
        10.0, gt=0, description="also checkpoint at the end of the first tick this many minutes of run time after the "
                                "last checkpoint (null: only run.checkpoint_every); single-process runs")
    keep_checkpoints: int = Field(3, ge=1, le=100_000)
    run_dir: str | None = Field(None, description="default: runs/<name>-<timestamp>")
    deterministic: Literal[True] = Field(True, description="the tick order is always fixed: reruns and resumes are "
                                                         "bit-identical (kept so configs that state it stay valid)")
    tensorboard: bool = Field(False, description="mirror every record's numbers to TensorBoard (<run_dir>/tensorboard; "
                                                "needs pip install 'esjax[tb]')")
    wandb: bool = Field(False, description="mirror every record's numbers to a Weights & Biases run (needs pip install "
                                           "'esjax[wandb]'; WANDB_MODE=offline keeps it local)")
    wandb_project: str = Field("esjax", min_length=1, description="the W&B project of run.wandb")
    progress: bool = True
    plots: bool = Field(True, description="draw plots/*.png (score, staleness, throughput) when the run ends; "
                                          "false saves ~1.5 s of matplotlib per run (sweeps, tests)")
    traces: Literal["eval", "none"] = Field(
        "eval", description="eval: write every evaluation's episodes (goal, instruction, actions with 200-character "
                            "observation snippets, reward and its breakdown) to traces/eval-v<version>.jsonl; none: "
                            "no traces")
    compilation_cache: str | None = Field(
        "~/.cache/esjax/xla", description="persistent XLA compilation cache (null: off); reruns start faster")
    max_nonfinite_updates: int = Field(
        10, ge=0, le=10_000_000,
        description="an update that would make θ non-finite is rejected (θ kept, cohort dropped, event logged); "
                    "the run stops once this many were rejected (0: at the first)")
    max_constant_fitness_updates: int | None = Field(
        None, ge=1, le=10_000_000,
        description="end the run early (with an evaluation and a checkpoint) once this many updates in a row had a "
                    "cohort whose fitnesses were all equal: a zero ES gradient, nothing left to learn from "
                    "(null: never; each such update is warned about and counted either way)")


class ModelSection(_Section):
    """Which policy: the embedded default, a tiny random one (tests), or an HF folder."""

    source: Literal["embedded", "hf", "random"] = "embedded"
    path: str | None = Field(None, description="HF folder (config.json, model.safetensors, tokenizer.json)")
    dtype: Literal["float32", "bfloat16"] = "float32"
    random_config: dict[str, Any] | None = Field(None, description="HF-style config for source=random")

    @model_validator(mode="after")
    def _check(self) -> ModelSection:
        if self.source == "hf":
            if not self.path:
                raise ValueError("model.path: required when model.source is 'hf'")
            if _path_problem(self.path, "dir") is not None:
                raise ValueError(f"model.path: {self.path[:200]!r} is not a directory")
            folder = Path(self.path).expanduser()
            if _path_problem(str(folder / "config.json"), "file") is not None:
                raise ValueError(f"model.path: {folder} has no config.json")
        return self


# ---------------------------------------------------------------------------------------------------------
# es: the ES estimator and step. Its defaults are the library's (esjax.es.ESConfig / NoiseSpec): one set of values
# ---------------------------------------------------------------------------------------------------------

_ES_DEFAULTS = ESConfig()  # sigma, learning_rate, scale, shaping, optimizer, decays; .noise: mode, rank, scope


class SGDOptimizer(_Section):
    """Plain SGD at ``es.learning_rate`` (``optax.sgd``): the published code's step. ``optimizer: sgd`` for short."""

    kind: Literal["sgd"] = "sgd"

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> str | dict[str, Any]:
        return _optimizer_dump(self, handler)


class AdamOptimizer(_Section):
    """Adam at ``es.learning_rate`` (``optax.adam``; the defaults are optax's). ``optimizer: adam`` for short."""

    kind: Literal["adam"] = "adam"
    b1: float = Field(0.9, ge=0, lt=1, description="decay of the first-moment estimate")
    b2: float = Field(0.999, ge=0, lt=1, description="decay of the second-moment estimate")
    eps: float = Field(1e-8, gt=0, description="added to the root of the second moment")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> str | dict[str, Any]:
        return _optimizer_dump(self, handler)


def _optimizer_dump(section: BaseModel, handler: SerializerFunctionWrapHandler) -> str | dict[str, Any]:
    """An optimizer at its defaults is written as its name (``optimizer: sgd``), as config.yaml always had it."""
    fields = type(section).model_fields
    if all(getattr(section, name) == field.default for name, field in fields.items()):
        return section.kind  # type: ignore[attr-defined]
    return handler(section)


OptimizerSection = Annotated[SGDOptimizer | AdamOptimizer, Field(discriminator="kind")]
_OPTIMIZERS: dict[str, type[BaseModel]] = {"sgd": SGDOptimizer, "adam": AdamOptimizer}


class ESSection(_Section):
    """The ES estimator and step. The defaults are :class:`esjax.es.ESConfig`'s, so a config without an ``es``
    section and ``ESConfig()`` describe the same update: σ = 1.5e-3, α = 7.5e-4, ``scale: llm`` (c = 1/N, σ
    folded into α; the published study's values for Qwen2.5-7B), centered ranks, SGD, no decays, rank-1 low-rank
    noise on the matrices."""

    population: int = Field(8, ge=2, le=100_000, description="N: accepted members per update")
    antithetic: bool = _ES_DEFAULTS.noise.antithetic
    mode: Literal["full", "lowrank"] = _ES_DEFAULTS.noise.mode
    rank: int = Field(_ES_DEFAULTS.noise.rank, ge=1, le=65_536)
    sigma: float = Field(_ES_DEFAULTS.sigma, gt=0, description="perturbation scale σ (the start value of a schedule)")
    sigma_final: float | None = Field(None, gt=0, description="end value for linear/cosine schedules")
    sigma_schedule: Literal["constant", "linear", "cosine"] = "constant"
    learning_rate: float = Field(_ES_DEFAULTS.learning_rate, gt=0, description="step size α of the optimizer")
    scale: Literal["nes", "llm"] = Field(_ES_DEFAULTS.scale, description="nes: 1/(N sigma); llm: 1/N, sigma folded "
                                                                         "into lr")
    shaping: Literal["centered_ranks", "z_score", "raw"] = _ES_DEFAULTS.shaping
    optimizer: OptimizerSection = Field(
        _OPTIMIZERS[_ES_DEFAULTS.optimizer](),
        description="the step: a name ('sgd', 'adam') or a mapping with 'kind' and that kind's settings")
    weight_decay: float = Field(_ES_DEFAULTS.weight_decay, ge=0)
    anchor_decay: float = Field(_ES_DEFAULTS.anchor_decay, ge=0, description="decay toward the initial weights")
    scope: Literal["matrices", "all"] = _ES_DEFAULTS.noise.scope.kind
    include: Patterns = Field(_ES_DEFAULTS.noise.scope.include,
                              description="regular expressions searched in parameter paths")
    exclude: Patterns = _ES_DEFAULTS.noise.scope.exclude

    @model_validator(mode="before")
    @classmethod
    def _optimizer_kind(cls, data: Any) -> Any:
        """``optimizer: adam`` is ``optimizer: {kind: adam}``; a mapping without ``kind`` is the default kind's."""
        if isinstance(data, dict):
            value = data.get("optimizer")
            if isinstance(value, str):
                data = {**data, "optimizer": {"kind": value}}
            elif isinstance(value, dict) and "kind" not in value:
                data = {**data, "optimizer": {"kind": _ES_DEFAULTS.optimizer, **value}}
        return data

    @model_validator(mode="after")
    def _check(self) -> ESSection:
        for key in ("include", "exclude"):
            for i, pattern in enumerate(getattr(self, key)):
                try:
                    re.compile(pattern)
                except re.error as err:
                    raise ValueError(f"es.{key}: {pattern[:100]!r} (item {i}) is not a valid regular expression "
                                     f"({err})") from None
        if self.antithetic and self.population % 2:
            raise ValueError(f"es.population: must be even with es.antithetic=true, got {self.population}")
        if self.sigma_schedule != "constant" and self.sigma_final is None:
            raise ValueError(f"es.sigma_final: required with es.sigma_schedule={self.sigma_schedule!r}")
        return self


# ---------------------------------------------------------------------------------------------------------
# schedule: one model per kind, selected by ``kind``
# ---------------------------------------------------------------------------------------------------------


class _Schedule(_Section):
    """Keys every staleness schedule has. A key of another kind is an error, except at the neutral value every
    config.yaml written before the per-kind sections holds (``lag: 0``, ``stale_fraction: 0.0``): it is dropped."""

    kind: str
    max_lag: int = Field(1, ge=0, le=100_000, description="K: accept a fitness measured at version v iff t - v <= K "
                                                          "(the trainer keeps θ of versions t-K .. t)")
    slots: int = Field(8, ge=1, le=100_000, description="concurrent member rollouts (G workers)")

    _neutral: ClassVar[dict[str, tuple[float, ...]]] = {"lag": (0,), "stale_fraction": (0.0,)}

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            drop = [key for key, values in cls._neutral.items()
                    if key in data and key not in cls.model_fields and type(data[key]) in (int, float)
                    and data[key] in values]
            if drop:
                data = {key: value for key, value in data.items() if key not in drop}
        return data

    @model_validator(mode="after")
    def _lag_within_bound(self) -> _Schedule:
        """A kind with a lag k (controlled, all_stale) needs k <= K: a lag-k fitness must still be accepted."""
        lag = getattr(self, "lag", None)
        if lag is not None and lag > self.max_lag:
            raise ValueError(f"schedule.lag: {lag} exceeds schedule.max_lag={self.max_lag}")
        return self


class SyncSchedule(_Schedule):
    """Synchronous ES: dispatch N members at version t, wait for all of them (the barrier), update. Every
    accepted fitness has lag 0."""

    kind: Literal["sync"] = "sync"


class AsyncSchedule(_Schedule):
    """Natural asynchrony: every slot stays busy at the current version; a fitness measured at version v joins
    the update at t iff t - v <= max_lag."""

    kind: Literal["async"] = "async"


class ControlledSchedule(_Schedule):
    """Controlled staleness: every cohort after warm-up holds exactly round(p·N) members measured exactly k
    updates earlier, whatever the completion order."""

    kind: Literal["controlled"] = "controlled"
    lag: int = Field(ge=1, le=100_000, description="k: the lag of the stale members (<= max_lag)")
    stale_fraction: float = Field(gt=0, le=1, description="p: the stale share of every cohort")


class AllStaleSchedule(_Schedule):
    """Stress test: after warm-up every fitness of every cohort is exactly k updates old (p = 1)."""

    kind: Literal["all_stale"] = "all_stale"
    lag: int = Field(ge=1, le=100_000, description="k: the lag of every member (<= max_lag)")

    _neutral: ClassVar[dict[str, tuple[float, ...]]] = {"stale_fraction": (0.0, 1.0)}  # p = 1 by definition


class ExtremeLagSchedule(_Schedule):
    """Stress test: a fraction p of members each get a lag drawn uniformly from 1..max_lag."""

    kind: Literal["extreme_lag"] = "extreme_lag"
    stale_fraction: float = Field(gt=0, lt=1, description="p: the share of members delayed (< 1: with every "
                                                          "member delayed no cohort could start)")

    @model_validator(mode="after")
    def _check(self) -> ExtremeLagSchedule:
        if self.max_lag < 1:
            raise ValueError(f"schedule.max_lag: extreme_lag draws delays in 1..max_lag, so it needs "
                             f"max_lag >= 1, got {self.max_lag}")
        return self


ScheduleSection = Annotated[SyncSchedule | AsyncSchedule | ControlledSchedule | AllStaleSchedule
                            | ExtremeLagSchedule, Field(discriminator="kind")]
DEFAULT_SCHEDULE = AsyncSchedule()


#: Deprecated names of env.goals values: ``synthetic`` was WebShop's templated goal set (items_ins_v2).
GOAL_SET_ALIASES = {"synthetic": "templated"}


def goal_set_label(env: EnvSection) -> str:
    """What the evaluated goals are, for printed lines: ``templated`` / ``human`` WebShop goals, or the
    synthetic shop's own (env.goals does not apply to it)."""
    return "synthetic-shop" if env.data == "synthetic" else env.goals


class EnvSection(_Section):
    """Where episodes come from."""

    data: str = Field("synthetic", description="'synthetic', 'webshop_small' (the packaged real 1,000-product set) "
                                               "or a folder with WebShop data files")
    num_products: int = Field(300, ge=10, le=10_000_000, description="the synthetic shop's catalog size "
                                                                       "(env.data: synthetic only; a WebShop set "
                                                                       "uses all its products)")
    catalog_seed: int = Field(0, ge=0, le=MAX_SEED)
    goals: Literal["templated", "human"] = Field(
        "templated", description="WebShop's goal set (real data): templated (WebShop's instructions built from the "
                                 "attribute file items_ins_v2, the default) or human (items_human_ins.json: the "
                                 "instructions WebShop's published test scores use); 'synthetic' is a deprecated "
                                 "name of templated. The synthetic shop (env.data: synthetic) has its own goals")
    human_file: str | None = Field(None, description="items_human_ins.json for env.goals=human (default: the one in "
                                                     "the env.data folder)")
    tasks_per_member: int = Field(4, ge=1, le=100_000, description="goals in each version's task batch")
    max_steps: int = Field(10, ge=1, le=100_000, description="episode step cap")
    eval_goals: int = Field(200, ge=1, le=1_000_000, description="held-out goals per evaluation")
    eval_split: Literal["test", "eval", "train"] = "test"
    step_timeout_s: float | None = Field(
        60.0, gt=0, description="an env step taking longer fails its episode (null: no limit); failed "
                                "episodes (timeouts or exceptions) are re-run up to env.max_retries times")
    max_retries: int = Field(2, ge=0, le=1_000, description="re-runs of a member's failed episodes before its job is "
                                                  "dropped (counted as 'abandoned')")
    pool: Literal["inprocess", "process", "ray"] = Field(
        "inprocess", description="where env sessions live: inprocess (this process), process (env.workers worker "
                                 "processes) or ray (env.workers Ray actors; needs 'esjax[ray]'); the same "
                                 "episodes and metrics either way")
    workers: int = Field(2, ge=1, le=100_000, description="worker processes / Ray actors of env.pool: process | ray")
    ray_address: str | None = Field(None, description="Ray cluster of env.pool: ray (e.g. 'auto' or "
                                                      "'ray://head:10001'); null: RAY_ADDRESS, else a local Ray")

    @field_validator("goals", mode="before")
    @classmethod
    def _goals_alias(cls, value: Any) -> Any:
        """``synthetic``, the name before ``templated``: old config.yaml files and exports still load and resume
        (it never meant the synthetic shop)."""
        return GOAL_SET_ALIASES.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> EnvSection:
        from envs.webshop_bridge.shop import PACKAGED_DATA

        if self.data not in ("synthetic", *PACKAGED_DATA) and _path_problem(self.data, "dir") is not None:
            problem = _path_problem(self.data, "any") or "is not a directory"
            raise ValueError(f"env.data: {self.data[:200]!r} {problem} "
                             f"(expected 'synthetic', {', '.join(map(repr, PACKAGED_DATA))} or a data folder)")
        if self.goals == "human" and self.data == "synthetic":
            raise ValueError("env.goals: 'human' needs real WebShop data (env.data: a folder with "
                             "items_human_ins.json); the synthetic shop has only its own generated goals")
        if self.human_file is not None and (problem := _path_problem(self.human_file, "file")) is not None:
            raise ValueError(f"env.human_file: {self.human_file[:200]!r} {problem}")
        return self


class AgentSection(_Section):
    """How the policy picks actions: by scoring each valid action's description (score mode, see
    esjax.agent.webshop), or by writing the action as text (generate mode, see esjax.agent.react)."""

    mode: Literal["score", "generate"] = Field(
        "score", description="score: the policy ranks candidate action descriptions; generate: it writes each action "
                             "(search[...] / click[...]) token by token, sampled for training, greedy for evaluation")
    prompt_style: Literal["auto", "compact", "chat"] = Field(
        "auto", description="compact one-line state, or the full observation in the chat template; "
                            "auto = chat when the model has a chat template and is not the embedded policy")
    temperature: float = Field(1.0, ge=0, description="sampling temperature over candidate scores; 0 = greedy")
    max_prompt_tokens: int = Field(512, ge=16, le=1_048_576)
    max_candidate_tokens: int = Field(24, ge=1, le=65_536, description="longer candidate descriptions keep their head")
    score_norm: Literal["mean", "sum"] = Field(
        "mean", description="compare candidates by mean per-token log-likelihood (mean) or its sum (sum: "
                            "favours short candidates such as 'next page')")
    max_new_tokens: int = Field(32, ge=1, le=65_536, description="generate mode: longest reply of one turn")
    top_p: float = Field(1.0, gt=0, le=1, description="generate mode: nucleus sampling mass (1: off)")
    top_k: int = Field(0, ge=0, le=1_000_000, description="generate mode: sample among the k likeliest tokens (0: off)")
    reasoning: bool = Field(False, description="generate mode: ask for 'Thought: ...' then 'Action: ...' (ReAct)")
    decode_steps: int = Field(1, ge=1, le=1024, description="generate mode: decode steps per tick (more: fewer host "
                                                          "round trips, more steps wasted after a reply completes)")


class MeshSection(_Section):
    """Device mesh ('data', 'model'); 0 means all devices on that axis."""

    data: int = Field(0, ge=0, le=1_000_000)
    model: int = Field(1, ge=1, le=1_000_000)
    distributed: bool = Field(False, description="call jax.distributed.initialize from the environment")


class Config(_Section):
    """A whole run."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)  # sections come in as dicts

    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    es: ESSection = ESSection()
    schedule: ScheduleSection = DEFAULT_SCHEDULE
    env: EnvSection = EnvSection()
    agent: AgentSection = AgentSection()
    mesh: MeshSection = MeshSection()

    @model_validator(mode="before")
    @classmethod
    def _default_schedule_kind(cls, data: Any) -> Any:
        """A ``schedule`` mapping without ``kind`` is the default kind's (async)."""
        if isinstance(data, dict) and isinstance(data.get("schedule"), dict) and "kind" not in data["schedule"]:
            data = {**data, "schedule": {"kind": DEFAULT_SCHEDULE.kind, **data["schedule"]}}
        return data

    @model_validator(mode="after")
    def _check(self) -> Config:
        s, n = self.schedule, self.es.population
        if isinstance(s, ControlledSchedule) and int(s.stale_fraction * n + 0.5) < 1:  # schedules.stale_count
            raise ValueError(f"schedule.stale_fraction: p = {s.stale_fraction} with es.population={n} gives "
                             f"round(p·N) = 0 stale members per cohort (controlled needs at least one)")
        episodes = s.slots * self.env.tasks_per_member
        if episodes > MAX_CONCURRENT_EPISODES:
            raise ValueError(f"schedule.slots: {s.slots} slots × env.tasks_per_member={self.env.tasks_per_member} "
                             f"= {episodes:,} concurrent episodes, more than {MAX_CONCURRENT_EPISODES:,}")
        return self


MAX_CONCURRENT_EPISODES = 10_000_000


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------

Origins = dict[tuple[str, ...], str]  # key path -> the file (or --set) that set it


class _Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 numbers: ``1e-3`` and ``1E5`` are floats (YAML 1.1 wants a dot)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def _duplicate_key(node: yaml.Node, path: tuple[str, ...] = ()) -> tuple[str, int] | None:
    """(dotted key, line) of the first key set twice in one mapping, or None."""
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                if key in seen:
                    return ".".join((*path, str(key))), key_node.start_mark.line + 1
                seen.add(key)
            found = _duplicate_key(value_node, (*path, str(key)))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, (*path, str(i)))
            if found:
                return found
    return None


def _load_yaml(text: str, source: str) -> Any:
    """One YAML document (None when empty); a key set twice in a mapping is an error."""
    loader = None
    try:
        loader = _Loader(text)  # the reader already rejects non-printable characters
        node = loader.get_single_node()
        if node is None:
            return None
        duplicate = _duplicate_key(node)
        if duplicate is not None:
            raise ConfigError(f"{source}: duplicated key {duplicate[0]!r} (line {duplicate[1]}); each key may be "
                              "set once")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{where}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``'es.sigma=0.01'`` → ``('es.sigma', 0.01)``; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {text!r}: empty key")
    value = _load_yaml(raw, f"--set {text!r}") if raw.strip() else ""
    return key.strip(), value


def _blame(key: tuple[str, ...], origins: Origins, default: str) -> str:
    """The file (or --set) that set ``key`` or its closest enclosing section; ``default`` when none did."""
    for n in range(len(key), 0, -1):
        if key[:n] in origins:
            return origins[key[:n]]
    return default


def _kinds(field: Any) -> dict[str, type[BaseModel]] | None:
    """kind -> model of a field that is a discriminated union of sections (schedule, es.optimizer), else None."""
    if field.discriminator is None:
        return None
    return {member.model_fields["kind"].default: member for member in typing.get_args(field.annotation)}


def _section_of(model: type[BaseModel] | None, name: str) -> tuple[type[BaseModel] | None, dict[str, type] | None]:
    """The section model of field ``name`` of ``model`` (None for a plain value) and, for a union, its kinds."""
    field = model.model_fields.get(name) if model is not None else None
    if field is None:
        return None, None
    kinds = _kinds(field)
    if kinds is not None:
        return None, kinds
    kind = field.annotation
    return (kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None), None


def _resolve_loc(loc: tuple[Any, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], str, dict[str, type]] | None]:
    """A pydantic error location as the user's key path, without the kind tags pydantic inserts after a
    discriminated union (``('schedule', 'async', 'lag')`` → ``('schedule', 'lag')``), and the innermost union
    on the way: (its path, the kind chosen, all its kinds)."""
    path: list[str] = []
    union = None
    model: type[BaseModel] | None = Config
    parts = [str(part) for part in loc]
    i = 0
    while i < len(parts):
        path.append(parts[i])
        model, kinds = _section_of(model, parts[i])
        i += 1
        if kinds is not None and i < len(parts) and parts[i] in kinds:
            union = (tuple(path), parts[i], kinds)
            model = kinds[parts[i]]
            i += 1
    return tuple(path), union


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _format_validation_error(err: ValidationError, source: str, origins: Origins | None = None) -> str:
    origins = origins or {}
    first = err.errors()[0]
    path, union = _resolve_loc(first["loc"])
    loc = ".".join(path)
    msg = first["msg"]
    if first["type"] == "union_tag_invalid":  # an unknown kind of schedule / optimizer
        _, kinds = _section_of(_resolve_model(path[:-1]), path[-1])
        key = path if path in _SHORTHAND_UNIONS else (*path, "kind")
        expected = _and([repr(kind) for kind in kinds or {}]).replace(" and ", " or ")
        return (f"{_blame(key, origins, source)}: {'.'.join(key)}: unknown kind {_short(first['input'].get('kind'))}; "
                f"expected {expected}")
    if union is not None and len(path) == len(union[0]) + 1:  # a key of a kind's section
        section, kind, kinds = union
        where = f"{'.'.join(section)} kind {kind!r}"
        if first["type"] == "extra_forbidden":
            owners = [other for other, model in kinds.items() if path[-1] in model.model_fields]
            if owners:
                keys = ", ".join(kinds[kind].model_fields)
                return (f"{_blame(path, origins, source)}: {loc}: not a key of {where} (only {_and(owners)} "
                        f"{'has' if len(owners) == 1 else 'have'} it; {kind} has {keys})")
        elif first["type"] == "missing":
            return f"{_blame((*section, 'kind'), origins, source)}: {loc}: required for {where}"
    if first["type"] == "extra_forbidden":
        hint = _did_you_mean(path)
        return f"{_blame(path, origins, source)}: unknown key {loc!r}" + (f"; did you mean {hint!r}?" if hint else "")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        # Validators name their own key ("es.population: ..."); keep that form and blame that key's file.
        named = msg.split(" ")[0]
        if named.endswith(":") and "." in named:
            return f"{_blame(tuple(named[:-1].split('.')), origins, source)}: {msg}"
        return f"{_blame(path, origins, source)}: {loc}: {msg}"
    got = first.get("input")
    got_text = f" (got {_short(got)})" if got is not None and not isinstance(got, dict) else ""
    return f"{_blame(path, origins, source)}: {loc}: {msg}{got_text}"


_SHORTHAND_UNIONS = {("es", "optimizer")}  # unions also written as a bare kind name (optimizer: adam)


def _resolve_model(path: tuple[str, ...]) -> type[BaseModel] | None:
    """The section model at a key path of :class:`Config` (None past a plain value or a union)."""
    model: type[BaseModel] | None = Config
    for name in path:
        model, _ = _section_of(model, name)
    return model


def _known_keys(model: type[BaseModel] | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every settable key path of :class:`Config` (sections and their fields; a union's: every kind's)."""
    out: list[tuple[str, ...]] = []
    for name in (model or Config).model_fields:
        out.append((*prefix, name))
        section, kinds = _section_of(model or Config, name)
        for sub in ([section] if section is not None else list((kinds or {}).values())):
            out.extend(key for key in _known_keys(sub, (*prefix, name)) if key not in out)
    return out


def _did_you_mean(path: tuple[str, ...]) -> str | None:
    """The known key closest to the unknown ``path``: a sibling spelled alike (``es.sigmma`` → ``es.sigma``),
    else the same name or a close one in another section (``run.sigma`` → ``es.sigma``); None when nothing is close."""
    known = _known_keys()
    siblings = [key[-1] for key in known if key[:-1] == path[:-1]]
    close = difflib.get_close_matches(path[-1], siblings, n=1, cutoff=0.6)
    if close:
        return ".".join((*path[:-1], close[0]))
    elsewhere = {".".join(key): key[-1] for key in known if len(key) == len(path) and key[:-1] != path[:-1]}
    same = [dotted for dotted, name in elsewhere.items() if name == path[-1]]
    if len(same) == 1:
        return same[0]
    close = difflib.get_close_matches(".".join(path), list(elsewhere), n=1, cutoff=0.8)
    return close[0] if close else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def config_from_dict(raw: dict[str, Any], source: str = "<config>", origins: Origins | None = None) -> Config:
    """Validate a plain dict into a :class:`Config`, raising :class:`ConfigError` on any problem.

    ``origins`` (key path → file) names the file that set a bad key; ``source`` is named otherwise."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source, origins)) from None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def key_paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of a nested mapping, sections before their keys (``("es",)``, ``("es", "sigma")``, ...)."""
    for key, value in tree.items():
        yield (*prefix, str(key))
        if isinstance(value, dict):
            yield from key_paths(value, (*prefix, str(key)))


def _read_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], Origins]:
    """A config file as a dict, ``extends:`` merged underneath, and which file set each key."""
    file = Path(path)
    try:
        if not file.is_file():
            raise ConfigError(f"{path}: config file not found" if not file.exists() else f"{path}: not a file")
        data = file.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror or err.__class__.__name__})") from None
    except ValueError as err:  # an embedded NUL byte in the path
        raise ConfigError(f"{str(path)[:200]!r}: not a usable config path ({err})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})") from None
    raw = _load_yaml(text, str(path))
    if raw is None:
        raise ConfigError(f"{path}: the config file is empty (expected a mapping of sections such as 'run:', 'es:'; "
                          "write '{}' for all defaults)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    origins: Origins = {}
    merged = raw
    if parent is not None:
        if not isinstance(parent, str) or not parent.strip():
            raise ConfigError(f"{path}: extends: expected a file name, got {_short(parent)}")
        parent_file = (file.parent / parent).resolve()
        if parent_file in _seen or parent_file == file.resolve():
            raise ConfigError(f"{path}: extends: {parent} forms a cycle")
        if not parent_file.is_file():
            raise ConfigError(f"{path}: extends: {parent!r} not found ({parent_file})")
        base, origins = _read_tree(parent_file, (*_seen, file.resolve()))
        merged = _deep_merge(base, raw)
    origins.update(dict.fromkeys(key_paths(raw), str(path)))
    return merged, origins


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a dict, with ``extends: OTHER.yaml`` (relative to the file) merged underneath."""
    return _read_tree(path)[0]


def load_config(path: str | Path | None, overrides: list[str] | None = None, *,
                base: dict[str, Any] | None = None, base_source: str = "<base>") -> Config:
    """Read a YAML config file (or defaults when ``path`` is None) and apply ``--set`` overrides.

    ``base`` (a dict of sections, e.g. the settings an export recorded beside its weights) lies under the
    file: keys the file or an override sets win; a bad key of ``base`` is blamed on ``base_source``."""
    source = str(path) if path is not None else "<defaults>"
    raw, origins = _read_tree(path) if path is not None else ({}, {})
    if base:
        if not isinstance(base, dict):
            raise ConfigError(f"{base_source}: expected a mapping of sections, got {type(base).__name__}")
        under = dict.fromkeys(key_paths(base), base_source)
        raw, origins = _deep_merge(base, raw), {**under, **origins}
        if path is None:
            source = base_source
    for text in overrides or []:
        key, value = parse_override(text)
        where = f"--set {text[:200] if text.isprintable() else repr(text[:200])}"
        _set_dotted(raw, key, value, where)
        keys = tuple(key.split("."))
        origins[keys] = where
        for n in range(1, len(keys)):  # a section only this override names (an unknown one is blamed on it)
            origins.setdefault(keys[:n], where)
        if isinstance(value, dict):
            origins.update(dict.fromkeys(((*keys, *sub) for sub in key_paths(value)), where))
    return config_from_dict(raw, source, origins)


def config_to_yaml(config: Config) -> str:
    """The resolved config, as written into every run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
