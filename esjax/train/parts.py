"""Building a run's parts from its config: the task and its data, the policy, the agent, the ES update's config, the
coordinator, and the optional packages a config needs; and reading a finished run's θ back (``load_run``).

The task (``env.task``) is reached only through :class:`esjax.task.Task`: its data and splits, its env pools and
its agents.

Each builder takes its own config section and the few scalars of other sections it needs, named
(``build_policy(config.model, task, seed)``); :func:`build_run_parts` is the one place that reads the whole config
and builds every part of a training run once (:class:`RunParts`).

Every function raises :class:`~esjax.config.ConfigError` naming the key when the config asks for something that
cannot be built, so a bad config fails before the loop starts.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esjax.agent.policy import LoadedPolicy, load_policy
from esjax.config import Config, ConfigError
from esjax.config.schema import (
    AgentSection,
    AllStaleSchedule,
    ControlledSchedule,
    EnvSection,
    ESSection,
    ExtremeLagSchedule,
    ModelSection,
    ScheduleSection,
)
from esjax.errors import TaskError
from esjax.es.noise import NoiseSpec, Scope
from esjax.es.sigma_schedules import constant, cosine, linear
from esjax.es.step import ESConfig, ESState
from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.es_update import ESUpdate
from esjax.loop.protocols import EnvPool, GeneratingAgent, ScoringAgent
from esjax.loop.rollout import RolloutEngine
from esjax.loop.staleness import Schedule, make_schedule
from esjax.rundir.checkpoint import Checkpointer
from esjax.rundir.directory import resume_config
from esjax.task import Task, task_class

if TYPE_CHECKING:
    from esjax.loop.generate_rollout import GenerateEngine


def build_task(env: EnvSection) -> Task:
    """The task ``env.task`` names, bound to the ``env`` section (its data is read on first use)."""
    return task_class(env.task)(env)


def load_task(env: EnvSection) -> Task:
    """The task of the ``env`` section with its data read: a bad data file (the task's
    :class:`~esjax.errors.TaskError`) is a :class:`ConfigError` with the task's one-line message."""
    task = build_task(env)
    try:
        task.data  # noqa: B018 - read once here, so bad input fails before anything compiles
    except TaskError as err:
        raise ConfigError(str(err)) from None
    return task


def build_pool(env: EnvSection, task: Task, capacity: int) -> EnvPool:
    """``capacity`` env sessions of ``task`` where ``env.pool`` says: in this process, or in ``env.workers``
    worker processes / Ray actors that each build the task's data themselves (:meth:`Task.process_pool`,
    :meth:`Task.pool_recipe`; a Ray cluster's address comes from ``env.ray_address`` or ``RAY_ADDRESS``; none: Ray
    starts a local one, unless ``ray.init`` was already called).

    In a multi-process job each process serves its share of the rows in such a pool and the answers are
    exchanged (:class:`esjax.parallel.envrows.ProcessRowsPool`)."""
    import jax

    if jax.process_count() > 1:
        from esjax.parallel.envrows import ProcessRowsPool

        return ProcessRowsPool(capacity, lambda rows: _local_pool(env, task, rows), jax.process_index(),
                               jax.process_count())
    return _local_pool(env, task, capacity)


def _local_pool(env: EnvSection, task: Task, capacity: int) -> EnvPool:
    if env.pool == "inprocess":
        return task.pool(capacity)
    try:
        if env.pool == "process":
            return task.process_pool(capacity, env.workers)
        recipe = task.required_recipe("ray")
    except TaskError as err:
        raise ConfigError(str(err)) from None
    from esjax.parallel.envpool_ray import RayEnvPool

    return RayEnvPool(recipe, capacity, workers=env.workers, address=env.ray_address)


def held_out_goals(env: EnvSection, task: Task, quiet: bool = False) -> list[int]:
    """The first ``env.eval_goals`` goals of ``env.eval_split``; says so when the split holds fewer than asked
    (e.g. a small synthetic shop), so an evaluation "on 129 goals" after asking for 200 is never a surprise."""
    split = list(task.split(env.eval_split))
    goals = split[: env.eval_goals]
    if len(split) < env.eval_goals and goals and not quiet:
        print(f"note: env.eval_goals={env.eval_goals}, but the {env.eval_split} split of {task.data_name()} "
              f"holds {len(split)} goals: evaluating on all {len(split)}", file=sys.stderr, flush=True)
    return goals


def build_policy(m: ModelSection, task: Task, seed: int) -> LoadedPolicy:
    """The policy of the ``model`` section (``seed``: the run's, for a random model and a from-scratch tokenizer
    trained on the ``task``'s texts)."""
    from esjax.model.config import ModelConfigError
    from esjax.model.hf import ModelFileError

    try:
        return load_policy(m.source, m.path, m.dtype, random_config=m.random_config, seed=seed,
                           texts=lambda: task.texts(), embedded=m.embedded)
    except (ModelFileError, ModelConfigError) as err:  # a missing, corrupt or unsupported model file: one line
        key = "model.random_config" if m.source == "random" else "model.path"
        raise ConfigError(f"{key}: {err}") from None
    except TaskError as err:
        raise ConfigError(str(err)) from None


def resolve_prompt_style(agent: AgentSection, policy: LoadedPolicy, model_source: str) -> str:
    """``agent.prompt_style`` with ``auto`` decided: chat for an HF model (``model_source``) with a chat template,
    else compact."""
    style = agent.prompt_style
    if style == "auto":
        style = "chat" if policy.chat_template is not None and model_source == "hf" else "compact"
    return style


def build_agent(a: AgentSection, policy: LoadedPolicy, model_source: str, task: Task
                ) -> ScoringAgent | GeneratingAgent:
    """The ``task``'s agent for ``agent.mode`` (``model_source``: the model section's, for the prompt style)."""
    try:
        if a.mode == "generate":
            return task.generate_agent(policy, a)
        style = resolve_prompt_style(a, policy, model_source)
        if style == "chat" and policy.chat_renderer() is None:
            raise ConfigError("agent.prompt_style: 'chat' needs a model with a chat template "
                              "(tokenizer_config.json chat_template)")
        return task.score_agent(policy, a, style)
    except TaskError as err:
        raise ConfigError(str(err)) from None


def build_engine(a: AgentSection, pool: EnvPool, agent: ScoringAgent | GeneratingAgent, policy: LoadedPolicy,
                 es_config: ESConfig, max_steps: int, step_timeout: float | None) -> RolloutEngine | GenerateEngine:
    """The rollout engine of ``agent.mode``: candidate scoring (score) or generation (generate); episodes end after
    ``max_steps`` actions, an env step is abandoned after ``step_timeout`` seconds."""
    # σ is a schedule evaluated on the device; float() waits for everything queued before it, so evaluated once
    # per version (not per policy call) it no longer stalls the host until the previous call's program is done.
    sigma_at = functools.lru_cache(maxsize=64)(lambda v: float(es_config.sigma_at(v)))
    if a.mode == "generate":
        from esjax.agent.lanes import Sampling
        from esjax.loop.generate_rollout import GenerateEngine

        return GenerateEngine(pool, agent, policy.config, es_config.noise, sigma_at, max_steps,
                              Sampling(a.temperature, a.top_p, a.top_k), a.max_new_tokens, a.decode_steps,
                              a.max_prompt_tokens, step_timeout=step_timeout, unperturbed_turns=a.unperturbed_turns)
    return RolloutEngine(pool, agent, policy.config, es_config.noise, sigma_at, max_steps, a.temperature,
                         step_timeout=step_timeout)


def build_es_config(es: ESSection, seed: int, updates: int) -> ESConfig:
    """The ES update's config of the ``es`` section (``seed``: the run's noise seed; ``updates``: the run's length,
    over which a σ schedule runs)."""
    noise = NoiseSpec(seed=seed, mode=es.mode, rank=es.rank, antithetic=es.antithetic,
                      scope=Scope(es.scope, tuple(es.include), tuple(es.exclude)))
    sigma = _schedule(es.sigma_schedule, es.sigma, es.sigma_final, updates)
    # a constant α stays a float: the optimizer state (and so every checkpoint) is what it was before schedules
    learning_rate = (es.learning_rate if es.learning_rate_schedule == "constant" else
                     _schedule(es.learning_rate_schedule, es.learning_rate, es.learning_rate_final, updates))
    optimizer = build_optimizer(es, learning_rate)
    # a named optimizer is per-leaf already; the optax Adam built for non-default settings is per-leaf too, so
    # the update may still step it one group of leaves at a time (ESExecution.update_chunk_bytes)
    return ESConfig(noise=noise, sigma=sigma, learning_rate=learning_rate, scale=es.scale,
                    shaping=es.shaping, optimizer=optimizer, weight_decay=es.weight_decay,
                    anchor_decay=es.anchor_decay, per_leaf_optimizer=not isinstance(optimizer, str))


def _schedule(kind: str, start: float, final: float | None, updates: int):
    """A value over the versions (σ or α): one of :mod:`esjax.es.sigma_schedules`' hashable schedules, which optax
    also takes as a step-size schedule of its update count (= the version)."""
    if kind == "constant":
        return constant(start)
    return (linear if kind == "linear" else cosine)(start, final, updates)


def build_optimizer(es: ESSection, learning_rate=None):
    """``es.optimizer`` as :class:`ESConfig` takes it: the name when the section holds optax's defaults (a value,
    so equal configs are equal and share compiled programs), else the optax transformation with its settings (one
    object per distinct setting, so a config built again still shares them). ``learning_rate``: α or its
    schedule (default ``es.learning_rate``)."""
    optimizer = es.optimizer
    if optimizer == type(optimizer)():
        return optimizer.kind
    return _adam(es.learning_rate if learning_rate is None else learning_rate, optimizer.b1, optimizer.b2,
                 optimizer.eps)


@functools.cache
def _adam(learning_rate: float, b1: float, b2: float, eps: float):
    import optax

    return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)


def build_schedule(section: ScheduleSection) -> Schedule:
    """The staleness schedule of the config's ``schedule`` section (each kind with only its own keys)."""
    if isinstance(section, ControlledSchedule):
        return make_schedule(section.kind, lag=section.lag, fraction=section.stale_fraction)
    if isinstance(section, AllStaleSchedule):
        return make_schedule(section.kind, lag=section.lag)
    if isinstance(section, ExtremeLagSchedule):
        return make_schedule(section.kind, fraction=section.stale_fraction, max_lag=section.max_lag)
    return make_schedule(section.kind)


def build_coordinator(schedule: ScheduleSection, population: int, seed: int, tasks_per_member: int,
                      train_size: int, state: dict[str, Any] | None = None) -> Coordinator:
    """A coordinator for ``schedule`` (N = ``population``; task batches of ``tasks_per_member`` goals drawn from
    ``train_size`` with ``seed``), fresh or from a checkpoint's ``state``."""
    coord_config = CoordinatorConfig(population=population, max_lag=schedule.max_lag, seed=seed,
                                     train_size=train_size, tasks_per_member=tasks_per_member)
    if state is None:
        return Coordinator(coord_config, build_schedule(schedule))
    return Coordinator.from_state_dict(coord_config, build_schedule(schedule), state)


@dataclasses.dataclass(frozen=True)
class RunParts:
    """Everything a training run is built from, built once from the config (:func:`build_run_parts`)."""

    task: Task
    train_goals: list[int]
    eval_goals: list[int]
    policy: LoadedPolicy
    agent: ScoringAgent | GeneratingAgent
    es_config: ESConfig
    pool: EnvPool
    engine: RolloutEngine | GenerateEngine
    new_coordinator: Callable[..., Coordinator]  # (state=None): a fresh coordinator or one from a checkpoint
    mesh: Any = None  # the device mesh θ is sharded over (None on one device)
    sharded: Any = None  # the sharded ES program on that mesh

    def initial_state(self) -> ESState:
        """θ_0 (the policy's parameters, placed on the mesh) and the optimizer's initial state."""
        from esjax.es.step import init
        from esjax.model.sharding import put_global

        params = self.policy.params
        if self.sharded is not None:
            params = put_global(params, self.sharded.shardings.params)
        return init(self.es_config, params)

    def es_update(self, state: ESState, keep: int) -> ESUpdate:
        """The ES update applied to each complete cohort, keeping θ of the last ``keep`` versions: on a
        multi-device mesh, the sharded program (θ stays sharded)."""
        if self.sharded is None:
            return ESUpdate(self.es_config, state=state, keep=keep, update_fn=None)
        return ESUpdate(self.es_config, state=self.sharded.place(state), keep=keep, update_fn=self.sharded.update_fn)

    def close(self) -> None:
        """Release the env pool's workers (processes or Ray actors)."""
        self.pool.close()


def build_run_parts(config: Config) -> RunParts:
    """The task and its train / held-out goals, the policy, the agent, the ES config, the env pool (sized for
    every member job and evaluation row), the rollout engine and, on several devices, the mesh."""
    import jax

    env = config.env
    task = load_task(env)
    train_goals = list(task.split("train"))
    eval_goals = held_out_goals(env, task, quiet=jax.process_index() != 0)
    if not train_goals:
        raise ConfigError(f"env: the task's data ({task.data_name()}) has no train goals")
    if not eval_goals:
        raise ConfigError(f"env.eval_split: the task's data ({task.data_name()}) has no {env.eval_split!r} goals")
    policy = build_policy(config.model, task, config.run.seed)
    agent = build_agent(config.agent, policy, config.model.source, task)
    es_config = build_es_config(config.es, config.run.seed, config.run.updates)
    capacity = config.schedule.slots * env.tasks_per_member + len(eval_goals)
    pool = build_pool(env, task, capacity)  # env.pool: in this process, worker processes or Ray
    engine = build_engine(config.agent, pool, agent, policy, es_config, env.max_steps, env.step_timeout_s)
    mesh = sharded = None
    if len(jax.devices()) > 1:  # shard θ and its update over ('data', 'model'), all processes' devices
        from esjax.model.sharding import mesh_of
        from esjax.parallel.sharded import ShardedES

        mesh = mesh_of(config.mesh.data, config.mesh.model)
        sharded = ShardedES(es_config, policy.config, mesh)
    new_coordinator = functools.partial(build_coordinator, config.schedule, config.es.population, config.run.seed,
                                        env.tasks_per_member, len(train_goals))
    return RunParts(task, train_goals, eval_goals, policy, agent, es_config, pool, engine, new_coordinator, mesh,
                    sharded)


def check_extras(config: Config) -> None:
    """Optional packages the config needs, checked before anything is built: one line naming the extra."""
    for key, module, extra in (("tensorboard", "tensorboardX", "tb"), ("wandb", "wandb", "wandb")):
        if getattr(config.run, key):
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(f"run.{key}: true needs the optional {module} package, which is not installed: "
                                  f"pip install 'esjax[{extra}]' (or --set run.{key}=false)") from None
    if config.env.pool == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("env.pool: 'ray' needs the optional ray package, which is not installed: "
                          "pip install 'esjax[ray]' (or --set env.pool=process)")


def load_run(run_dir: str | Path, config: Config | None = None) -> tuple[Task, LoadedPolicy, Any, int]:
    """(task, policy, θ of the latest readable checkpoint, its version) of a run directory."""
    config = config or resume_config(run_dir)
    task = load_task(config.env)
    policy = build_policy(config.model, task, config.run.seed)
    state = ESUpdate(build_es_config(config.es, config.run.seed, config.run.updates), policy.params).state
    checkpointer = Checkpointer(run_dir, config.run.keep_checkpoints)
    try:
        def target(loop: dict[str, Any]) -> dict[str, Any]:
            return {"state": state, "versions": {str(v): state.params for v in loop["saved_versions"]}}

        _, tree, _ = checkpointer.restore_latest(target)
    finally:
        checkpointer.close()
    return task, policy, tree["state"].params, int(tree["state"].version)
