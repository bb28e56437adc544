"""Building a run's parts from its config: the shop, the policy, the agent, the ES update's config, the
coordinator, and the optional packages a config needs; and reading a finished run's θ back (``load_run``).

Each builder takes its own config section and the few scalars of other sections it needs, named
(``build_policy(config.model, shop, seed)``); :func:`build_run_parts` is the one place that reads the whole config
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

from esjax.agent.generate_agent import GenerateAgent
from esjax.agent.policy import LoadedPolicy, load_policy
from esjax.agent.webshop import WebShopAgent
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
from esjax.es.noise import NoiseSpec, Scope
from esjax.es.sigma_schedules import constant, cosine, linear
from esjax.es.step import ESConfig, ESState
from esjax.loop.coordinator import Coordinator, CoordinatorConfig
from esjax.loop.es_update import ESUpdate
from esjax.loop.protocols import EnvPool
from esjax.loop.rollout import RolloutEngine
from esjax.loop.staleness import Schedule, make_schedule
from esjax.rundir.checkpoint import Checkpointer
from esjax.rundir.directory import resume_config

if TYPE_CHECKING:
    from esjax.loop.generate_rollout import GenerateEngine


def shop_spec(env: EnvSection):
    """The environment's shop as a picklable recipe (:class:`~envs.webshop_bridge.factory.ShopSpec`): what env
    worker processes and Ray actors build their own copy from."""
    from envs.webshop_bridge import PACKAGED_DATA, ShopSpec

    if env.data == "synthetic":
        return ShopSpec(kind="synthetic", num_products=env.num_products, seed=env.catalog_seed)
    human_file = str(Path(env.human_file).expanduser()) if env.human_file else None
    return ShopSpec(kind="webshop", path=env.data if env.data in PACKAGED_DATA else str(Path(env.data).expanduser()),
                    seed=env.catalog_seed, goals=env.goals, human_file=human_file)


def build_shop(env: EnvSection):
    """The environment's shop: a synthetic catalog or WebShop data from a folder."""
    from envs.webshop_bridge import DataError

    try:
        return shop_spec(env).build()
    except DataError as err:
        raise ConfigError(f"env.data: {err}") from None


def build_pool(env: EnvSection, shop, capacity: int) -> EnvPool:
    """``capacity`` env sessions where ``env.pool`` says: in this process over ``shop``, or in ``env.workers``
    worker processes / Ray actors that each build the shop from :func:`shop_spec` (a Ray cluster's address
    comes from ``env.ray_address`` or ``RAY_ADDRESS``; none: Ray starts a local one, unless ``ray.init`` was
    already called).

    In a multi-process job each process serves its share of the rows in such a pool and the answers are
    exchanged (:class:`esjax.parallel.envrows.ProcessRowsPool`)."""
    import jax

    if jax.process_count() > 1:
        from esjax.parallel.envrows import ProcessRowsPool

        return ProcessRowsPool(capacity, lambda rows: _local_pool(env, shop, rows), jax.process_index(),
                               jax.process_count())
    return _local_pool(env, shop, capacity)


def _local_pool(env: EnvSection, shop, capacity: int) -> EnvPool:
    from envs.webshop_bridge import InProcessEnvPool, ProcessEnvPool

    if env.pool == "inprocess":
        return InProcessEnvPool(shop, capacity)
    if env.pool == "process":
        return ProcessEnvPool(shop_spec(env), capacity, workers=env.workers)
    from esjax.parallel.envpool_ray import RayEnvPool

    return RayEnvPool(shop_spec(env), capacity, workers=env.workers, address=env.ray_address)


def held_out_goals(env: EnvSection, shop, quiet: bool = False) -> list[int]:
    """The first ``env.eval_goals`` goals of ``env.eval_split``; says so when the split holds fewer than asked
    (e.g. a small synthetic shop), so an evaluation "on 129 goals" after asking for 200 is never a surprise."""
    split = list(shop.split(env.eval_split))
    goals = split[: env.eval_goals]
    if len(split) < env.eval_goals and goals and not quiet:
        print(f"note: env.eval_goals={env.eval_goals}, but the {env.eval_split} split of {shop.name} "
              f"holds {len(split)} goals: evaluating on all {len(split)}", file=sys.stderr, flush=True)
    return goals


def shop_texts(shop, limit: int = 5000):
    """Text a from-scratch tokenizer is trained on: instructions, titles and option values."""

    for i in range(min(len(shop.goals), limit)):
        yield shop.goals[i].instruction_text.lower()
    for i in range(min(len(shop), limit)):
        product = shop.product(i)
        yield f"open {product.title} choose buy now go back next page back to search page: results item chosen"


def build_policy(m: ModelSection, shop, seed: int) -> LoadedPolicy:
    """The policy of the ``model`` section (``seed``: the run's, for a random model and a from-scratch tokenizer
    trained on ``shop``'s texts)."""
    from esjax.model.config import ModelConfigError
    from esjax.model.hf import ModelFileError

    try:
        return load_policy(m.source, m.path, m.dtype, random_config=m.random_config, seed=seed,
                           texts=lambda: shop_texts(shop), embedded=m.embedded)
    except (ModelFileError, ModelConfigError) as err:  # a missing, corrupt or unsupported model file: one line
        key = "model.random_config" if m.source == "random" else "model.path"
        raise ConfigError(f"{key}: {err}") from None


def resolve_prompt_style(agent: AgentSection, policy: LoadedPolicy, model_source: str) -> str:
    """``agent.prompt_style`` with ``auto`` decided: chat for an HF model (``model_source``) with a chat template,
    else compact."""
    style = agent.prompt_style
    if style == "auto":
        style = "chat" if policy.chat_template is not None and model_source == "hf" else "compact"
    return style


def build_agent(a: AgentSection, policy: LoadedPolicy, model_source: str) -> WebShopAgent | GenerateAgent:
    """The agent of the ``agent`` section (``model_source``: the model section's, for the prompt style)."""
    if a.mode == "generate":
        return build_generate_agent(a, policy)
    style = resolve_prompt_style(a, policy, model_source)
    renderer = policy.chat_renderer()
    if style == "chat" and renderer is None:
        raise ConfigError("agent.prompt_style: 'chat' needs a model with a chat template "
                          "(tokenizer_config.json chat_template)")
    return WebShopAgent(policy.tokenizer, style, renderer, a.max_prompt_tokens, a.max_candidate_tokens, a.score_norm)


def build_generate_agent(a: AgentSection, policy: LoadedPolicy) -> GenerateAgent:
    """Generate mode's agent: the chat template when the model has one (a plain rendering otherwise), and the
    model's end-of-sequence tokens (config.json's and the tokenizer's) as stop tokens."""
    stop = set(policy.config.eos_token_ids)
    for name in ("eos_token", "<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        token = policy.special_tokens.get(name, name) if name == "eos_token" else name
        token_id = policy.tokenizer.token_to_id(token) if isinstance(token, str) else None
        if token_id is not None:
            stop.add(int(token_id))
    renderer = policy.chat_renderer() if a.prompt_style != "compact" else None
    return GenerateAgent(policy.tokenizer, renderer, sorted(stop), a.max_prompt_tokens, a.reasoning,
                         constrain=a.constrain)


def build_engine(a: AgentSection, pool: EnvPool, agent: WebShopAgent | GenerateAgent, policy: LoadedPolicy,
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

    shop: Any
    train_goals: list[int]
    eval_goals: list[int]
    policy: LoadedPolicy
    agent: WebShopAgent | GenerateAgent
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
    """The shop and its train / held-out goals, the policy, the agent, the ES config, the env pool (sized for
    every member job and evaluation row), the rollout engine and, on several devices, the mesh."""
    import jax

    env = config.env
    shop = build_shop(env)
    train_goals = list(shop.split("train"))
    eval_goals = held_out_goals(env, shop, quiet=jax.process_index() != 0)
    if not train_goals:
        raise ConfigError("env: the shop has no train goals")
    if not eval_goals:
        raise ConfigError(f"env.eval_split: the shop has no {env.eval_split!r} goals")
    policy = build_policy(config.model, shop, config.run.seed)
    agent = build_agent(config.agent, policy, config.model.source)
    es_config = build_es_config(config.es, config.run.seed, config.run.updates)
    capacity = config.schedule.slots * env.tasks_per_member + len(eval_goals)
    pool = build_pool(env, shop, capacity)  # env.pool: in this process, worker processes or Ray
    engine = build_engine(config.agent, pool, agent, policy, es_config, env.max_steps, env.step_timeout_s)
    mesh = sharded = None
    if len(jax.devices()) > 1:  # shard θ and its update over ('data', 'model'), all processes' devices
        from esjax.model.sharding import mesh_of
        from esjax.parallel.sharded import ShardedES

        mesh = mesh_of(config.mesh.data, config.mesh.model)
        sharded = ShardedES(es_config, policy.config, mesh)
    new_coordinator = functools.partial(build_coordinator, config.schedule, config.es.population, config.run.seed,
                                        env.tasks_per_member, len(train_goals))
    return RunParts(shop, train_goals, eval_goals, policy, agent, es_config, pool, engine, new_coordinator, mesh,
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


def load_run(run_dir: str | Path, config: Config | None = None) -> tuple[Any, LoadedPolicy, Any, int]:
    """(shop, policy, θ of the latest readable checkpoint, its version) of a run directory."""
    config = config or resume_config(run_dir)
    shop = build_shop(config.env)
    policy = build_policy(config.model, shop, config.run.seed)
    state = ESUpdate(build_es_config(config.es, config.run.seed, config.run.updates), policy.params).state
    checkpointer = Checkpointer(run_dir, config.run.keep_checkpoints)
    try:
        def target(loop: dict[str, Any]) -> dict[str, Any]:
            return {"state": state, "versions": {str(v): state.params for v in loop["saved_versions"]}}

        _, tree, _ = checkpointer.restore_latest(target)
    finally:
        checkpointer.close()
    return shop, policy, tree["state"].params, int(tree["state"].version)
