"""The run configuration's schema: YAML files validated into typed objects before anything compiles.

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

This module is the schema (the sections and their checks); :mod:`esjax.config.loading` reads files and
overrides into it and reports errors.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    SerializerFunctionWrapHandler,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from esjax.errors import EsjaxError, TaskError
from esjax.es.step import ESConfig
from esjax.task import DEFAULT_TASK, Task, task_class

MAX_SEED = 2**32 - 1
Patterns = Annotated[tuple[str, ...], Field(strict=False)]  # a YAML list becomes the tuple


class ConfigError(EsjaxError, ValueError):
    """A configuration problem a user can fix; the message is one line and names the key."""


def path_problem(text: str, want: str) -> str | None:
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
    embedded: Literal["default", "hasty", "generate", "generate-hasty", "babyai"] = Field(
        "default", description="source=embedded: the shipped policy that scores candidates (default), a recipe of "
                               "it cloned to rarely click options (hasty: configs/hasty.yaml), the one that writes "
                               "its actions (generate), that one with a habit of buying without options "
                               "(generate-hasty), or the one that scores BabyAI's actions (babyai)")
    path: str | None = Field(None, description="HF folder (config.json, model.safetensors, tokenizer.json)")
    dtype: Literal["float32", "bfloat16"] = "float32"
    random_config: dict[str, Any] | None = Field(None, description="HF-style config for source=random")

    @model_validator(mode="after")
    def _check(self) -> ModelSection:
        if self.source == "hf":
            if not self.path:
                raise ValueError("model.path: required when model.source is 'hf'")
            if path_problem(self.path, "dir") is not None:
                raise ValueError(f"model.path: {self.path[:200]!r} is not a directory")
            folder = Path(self.path).expanduser()
            if path_problem(str(folder / "config.json"), "file") is not None:
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
    learning_rate: float = Field(_ES_DEFAULTS.learning_rate, gt=0, description="step size α of the optimizer (the "
                                                                              "start value of a schedule)")
    learning_rate_final: float | None = Field(None, gt=0, description="end value of α for linear/cosine schedules")
    learning_rate_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="α over the run's updates, as es.sigma_schedule does for σ")
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
        if self.learning_rate_schedule != "constant" and self.learning_rate_final is None:
            raise ValueError("es.learning_rate_final: required with "
                             f"es.learning_rate_schedule={self.learning_rate_schedule!r}")
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


class EnvSection(_Section):
    """Where episodes come from: the task (``env.task``) and the keys every task has. A task's own keys (WebShop's
    ``data``, ``catalog_seed``, ``goals``, ...) come from its :attr:`esjax.task.Task.Options` and are validated in
    the same section (:func:`env_section`)."""

    task: str = Field(DEFAULT_TASK, min_length=1, description="the task: a registered name (webshop, babyai) or a "
                                                             "dotted path 'package.module:Name' of an esjax.task.Task "
                                                             "subclass")
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


@functools.cache
def env_section(task: type[Task]) -> type[EnvSection]:
    """The ``env`` section of a task: the keys every task has (:class:`EnvSection`) and the task's own
    (``task.Options``), in one model with the strict rules of every section; the options' validators see the whole
    section."""
    options = task.Options
    shared = set(EnvSection.model_fields) & set(options.model_fields)
    if shared:
        raise TaskError(f"env.task: {task.__name__}.Options redefines env keys every task has: "
                        f"{', '.join(sorted(shared))}")

    class TaskEnvSection(EnvSection, options):  # type: ignore[misc, valid-type]
        model_config = _Section.model_config

    TaskEnvSection.__name__ = TaskEnvSection.__qualname__ = f"{task.__name__}EnvSection"
    return TaskEnvSection


def env_section_of(raw: Any) -> type[EnvSection]:
    """The ``env`` section model of a raw ``env`` mapping (its ``task``, default :data:`DEFAULT_TASK`); raises
    :class:`~esjax.errors.TaskError` naming ``env.task`` when the task cannot be found."""
    name = raw.get("task", DEFAULT_TASK) if isinstance(raw, dict) else DEFAULT_TASK
    return env_section(task_class(name if isinstance(name, str) else DEFAULT_TASK))


class AgentSection(_Section):
    """How the policy picks actions: by scoring each valid action's description (score mode), or by writing the
    action as text (generate mode); the task supplies the agent of each mode (:class:`esjax.task.Task`)."""

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
    unperturbed_turns: int = Field(
        0, ge=0, le=1_000_000, description="generate mode: an episode's first turns that every training member "
                                           "writes with θ itself (its ES member applies from the next turn): the "
                                           "members then share their first pages, e.g. 1 = one search per task")
    constrain: Literal["none", "clicks", "all"] = Field(
        "none", description="generate mode, constrained decoding (the reply written token by token from the policy's "
                            "own distribution, limited to the tokens that continue an allowed reply): 'clicks' = on "
                            "pages without a search bar the reply is one of the page's click actions (searches stay "
                            "free text); 'all' = also a search copies a word prefix of the instruction")

    @model_validator(mode="after")
    def _check(self) -> AgentSection:
        if self.constrain != "none" and self.reasoning:
            raise ValueError("agent.constrain: constrained replies hold the action alone; set agent.reasoning: false "
                             "(a 'Thought:' line cannot be constrained to the page's actions)")
        return self


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
    env: SerializeAsAny[EnvSection] = Field(default_factory=lambda: env_section_of({})())
    agent: AgentSection = AgentSection()
    mesh: MeshSection = MeshSection()

    @model_validator(mode="before")
    @classmethod
    def _default_schedule_kind(cls, data: Any) -> Any:
        """A ``schedule`` mapping without ``kind`` is the default kind's (async)."""
        if isinstance(data, dict) and isinstance(data.get("schedule"), dict) and "kind" not in data["schedule"]:
            data = {**data, "schedule": {"kind": DEFAULT_SCHEDULE.kind, **data["schedule"]}}
        return data

    @field_validator("env", mode="wrap")
    @classmethod
    def _task_env(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """An ``env`` mapping is validated as its task's section (:func:`env_section`)."""
        if isinstance(value, dict) and isinstance(value.get("task", DEFAULT_TASK), str):
            return env_section_of(value).model_validate(value)
        return handler(value)

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
