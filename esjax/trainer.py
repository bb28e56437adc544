"""The trainer behind ``python -m esjax.run``: builds the parts from a config and runs the async ES loop.

One tick of the loop: refill free rollout slots with jobs from the coordinator (the schedule decides at
which versions), let every live episode act (one batched policy call per live version), roll finished
episodes up into member fitness, and report every finished member to the coordinator, which accepts
(lag ≤ K), holds or discards them. Then, one at a time, each complete cohort comes back from the
coordinator, the jitted ES update is applied to θ_t, the version advances, and that version gets its own
update record, evaluation and checkpoint when the config asks for them (a cascade of updates in one tick
is several such steps). Evaluations of the unperturbed θ run as extra greedy rows in the same ticks, so
they never stop training rollouts.

The tick loop is deterministic: a run is bit-identical when repeated, and a resumed run is bit-identical
to an uninterrupted one. A checkpoint is taken only at a consistent point — every finished job of the
tick reported, θ and the coordinator at the same version (a cascade's next complete cohort is part of the
coordinator's state) — and holds θ of every version an in-flight episode needs, the coordinator's state
(accepted-but-not-applied fitness, held results, counters), each in-flight episode's trace (replayed on
resume without calling the model), evaluations in progress, and how many metrics records were written:
a resume drops the records written after it and writes them again, so ``metrics.jsonl`` has exactly one
record per (kind, version). When the run ends, every job still in flight, every held result and an
unapplied cohort is cancelled (``dispatched == accepted + discarded + cancelled``), an ``end`` record
carries the coordinator's final totals, and the last checkpoint is re-saved as finished: resuming a
finished run changes nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import platform
import shlex
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

import esjax
from esjax.agent.policy import LoadedPolicy, load_policy
from esjax.agent.webshop import WebShopAgent
from esjax.checkpoint import Checkpointer, StorageError
from esjax.cli_util import UserError
from esjax.config import Config, ConfigError, config_to_yaml, load_config
from esjax.es.noise import NoiseSpec, Scope
from esjax.es.schedules import constant, cosine, linear
from esjax.es.step import ESConfig
from esjax.loop.coordinator import Coordinator, CoordinatorConfig, RejectedUpdate
from esjax.loop.engine import ESUpdate
from esjax.loop.rollout import Episode, RolloutEngine
from esjax.loop.schedules import make_schedule
from esjax.loop.tasks import hash_ints
from esjax.loop.types import Job
from esjax.metrics import MetricsWriter, read_metrics, truncate_after, truncate_records
from esjax.progress import Progress
from esjax.stats import eval_intervals
from esjax.traces import TraceRecorder, write_traces

CONFIG_FILE = "config.yaml"


class RunAborted(UserError):
    """The run cannot go on (e.g. too many rejected non-finite updates); the last checkpoint is intact."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; the message says which checkpoint exists and how to resume (``esjax.run`` adds the
    exact command)."""

    def __init__(self, message: str, run_dir: Path, checkpoint: int | None, removed: bool = False):
        super().__init__(message)
        self.run_dir, self.checkpoint, self.removed = run_dir, checkpoint, removed


# ---------------------------------------------------------------------------------------------------------
# Building the parts from a config
# ---------------------------------------------------------------------------------------------------------


def build_shop(config: Config):
    """The environment's shop: a synthetic catalog or WebShop data from a folder."""
    from envs.webshop_bridge import PACKAGED_DATA, DataError, load_webshop, synthetic_shop

    env = config.env
    try:
        if env.data == "synthetic":
            return synthetic_shop(env.num_products, seed=env.catalog_seed)
        human_file = Path(env.human_file).expanduser() if env.human_file else None
        return load_webshop(env.data if env.data in PACKAGED_DATA else Path(env.data).expanduser(),
                            seed=env.catalog_seed, goals=env.goals, human_file=human_file)
    except DataError as err:
        raise ConfigError(f"env.data: {err}") from None


def shop_texts(shop, limit: int = 5000):
    """Text a from-scratch tokenizer is trained on: instructions, titles and option values."""

    for i in range(min(len(shop.goals), limit)):
        yield shop.goals[i].instruction_text.lower()
    for i in range(min(len(shop), limit)):
        product = shop.product(i)
        yield f"open {product.title} choose buy now go back next page back to search page: results item chosen"


def build_policy(config: Config, shop) -> LoadedPolicy:
    from esjax.model.config import ConfigError as ModelConfigError
    from esjax.model.hf import CheckpointError as ModelFileError

    m = config.model
    try:
        return load_policy(m.source, m.path, m.dtype, random_config=m.random_config, seed=config.run.seed,
                           texts=lambda: shop_texts(shop))
    except (ModelFileError, ModelConfigError) as err:  # a missing, corrupt or unsupported model file: one line
        key = "model.random_config" if m.source == "random" else "model.path"
        raise ConfigError(f"{key}: {err}") from None


def resolve_prompt_style(config: Config, policy: LoadedPolicy) -> str:
    """``agent.prompt_style`` with ``auto`` decided: chat for an HF model with a chat template, else compact."""
    style = config.agent.prompt_style
    if style == "auto":
        style = "chat" if policy.chat_template is not None and config.model.source == "hf" else "compact"
    return style


def build_agent(config: Config, policy: LoadedPolicy) -> WebShopAgent:
    style = resolve_prompt_style(config, policy)
    renderer = policy.chat_renderer()
    if style == "chat" and renderer is None:
        raise ConfigError("agent.prompt_style: 'chat' needs a model with a chat template "
                          "(tokenizer_config.json chat_template)")
    return WebShopAgent(policy.tokenizer, style, renderer, config.agent.max_prompt_tokens,
                        config.agent.max_candidate_tokens, config.agent.score_norm)


def build_es_config(config: Config) -> ESConfig:
    es = config.es
    noise = NoiseSpec(seed=config.run.seed, mode=es.mode, rank=es.rank, antithetic=es.antithetic,
                      scope=Scope(es.scope, tuple(es.include), tuple(es.exclude)))
    if es.sigma_schedule == "constant":
        sigma = constant(es.sigma)
    elif es.sigma_schedule == "linear":
        sigma = linear(es.sigma, es.sigma_final, config.run.updates)
    else:
        sigma = cosine(es.sigma, es.sigma_final, config.run.updates)
    optimizer = optax.sgd(es.learning_rate) if es.optimizer == "sgd" else optax.adam(es.learning_rate)
    return ESConfig(noise=noise, sigma=sigma, learning_rate=es.learning_rate, scale=es.scale,
                    shaping=es.shaping, optimizer=optimizer, weight_decay=es.weight_decay,
                    anchor_decay=es.anchor_decay)


def build_coordinator(config: Config, train_size: int, state: dict[str, Any] | None = None) -> Coordinator:
    s = config.schedule
    coord_config = CoordinatorConfig(population=config.es.population, max_lag=s.max_lag, seed=config.run.seed,
                                     train_size=train_size, tasks_per_member=config.env.tasks_per_member)
    schedule = make_schedule(s.kind, lag=s.lag, fraction=s.stale_fraction, max_lag=s.max_lag)
    if state is None:
        return Coordinator(coord_config, schedule)
    return Coordinator.from_state_dict(coord_config, schedule, state)


def git_commit() -> dict[str, Any]:
    """The commit of the esjax source checkout (``"unknown"`` when esjax is not run from a git checkout) and
    whether tracked files differ from it."""
    import subprocess

    root = Path(esjax.__file__).resolve().parent.parent
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()

        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top != root:  # esjax installed inside some other repository: that commit says nothing about esjax
            return {"commit": "unknown", "dirty": None}
        return {"commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {"commit": "unknown", "dirty": None}


def _session(overrides: list[str] | None) -> dict[str, Any]:
    """Who ran this start or resume: the esjax commit, the ``--set`` overrides, the machine and its devices."""
    from esjax.machine import machine_info

    source = git_commit()
    return {"git_commit": source["commit"], "git_dirty": source["dirty"], "overrides": list(overrides or []),
            "machine": machine_info(), "devices": [str(d) for d in jax.devices()], "argv": sys.argv,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def run_metadata(config: Config, overrides: list[str] | None = None) -> dict[str, Any]:
    import flax

    return {"esjax": esjax.__version__, "jax": jax.__version__, "jaxlib": jax.lib.__version__
            if hasattr(jax.lib, "__version__") else None, "flax": flax.__version__, "optax": optax.__version__,
            "python": sys.version.split()[0], "platform": platform.platform(), "seed": config.run.seed,
            "device_kind": jax.devices()[0].device_kind, **_session(overrides)}


def _record_resume(run_dir: Path, overrides: list[str] | None) -> None:
    """Append this resume (commit, overrides, machine) to run.json's ``resumes`` list (best effort: a run.json
    that is missing or unreadable is left alone)."""
    meta = read_run_info(run_dir)
    if meta is None:
        return
    meta.setdefault("resumes", []).append(_session(overrides))
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2))


def plot_title(config: Config, run_info: dict[str, Any] | None) -> str:
    """``default: async ES (K=1), seed 0, commit 0c0adf3d`` (``+`` marks uncommitted changes)."""
    commit = str((run_info or {}).get("git_commit") or "unknown")
    if commit != "unknown":
        commit = commit[:8] + ("+" if (run_info or {}).get("git_dirty") else "")
    return (f"{config.run.name}: {config.schedule.kind} ES (K={config.schedule.max_lag}), seed {config.run.seed}, "
            f"commit {commit}")


def read_run_info(run_dir: Path) -> dict[str, Any] | None:
    """run.json of a run directory, or None when it is missing or unreadable."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


# ---------------------------------------------------------------------------------------------------------
# Evaluation bookkeeping
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Evaluation:
    """A greedy evaluation of the unperturbed θ at ``version`` on fixed held-out goals."""

    eval_id: int
    version: int
    goals: list[int]
    started_tick: int
    started_wall: float
    next_position: int = 0
    rewards: dict[int, float] = dataclasses.field(default_factory=dict)
    retry: list[int] = dataclasses.field(default_factory=list)  # positions whose env failed: run again
    failures: int = 0
    # run.traces: eval: observation snippets of live episodes (by position) and finished episodes' trace lines
    recorder: TraceRecorder = dataclasses.field(default_factory=TraceRecorder)
    traces: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.rewards) == len(self.goals)

    def record(self, wall_time: float) -> dict[str, Any]:
        rewards = np.array([self.rewards[p] for p in range(len(self.goals))], np.float64)
        return {"kind": "eval", "version": self.version, "score": float(100 * rewards.mean()),
                "success_rate": float(np.mean(rewards == 1.0)), "mean_reward": float(rewards.mean()),
                **eval_intervals(rewards.tolist()),  # 95% over goals: t interval (score), Wilson (success rate)
                "goals": len(self.goals), "wall_time": wall_time, "eval_seconds": wall_time - self.started_wall}

    def to_dict(self) -> dict[str, Any]:
        out = {"eval_id": self.eval_id, "version": self.version, "started_tick": self.started_tick,
               "next_position": self.next_position, "rewards": {str(k): v for k, v in self.rewards.items()},
               "retry": list(self.retry), "failures": self.failures}
        if self.traces or self.recorder.observations:
            out["traces"] = {str(k): v for k, v in self.traces.items()}
            out["observations"] = {str(k): list(v) for k, v in self.recorder.observations.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], goals: list[int], started_wall: float) -> Evaluation:
        """An evaluation in progress, from a checkpoint's loop state (:meth:`to_dict`)."""
        ev = cls(int(data["eval_id"]), int(data["version"]), goals, int(data["started_tick"]), started_wall,
                 int(data["next_position"]), {int(k): float(v) for k, v in data["rewards"].items()},
                 [int(p) for p in data.get("retry", [])], int(data.get("failures", 0)))
        ev.traces = {int(k): v for k, v in (data.get("traces") or {}).items()}
        ev.recorder.observations = {int(k): list(v) for k, v in (data.get("observations") or {}).items()}
        return ev


# ---------------------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class JobProgress:
    job: Job
    started_tick: int
    rewards: dict[int, float] = dataclasses.field(default_factory=dict)
    started: int = 0  # episodes started (positions 0..started-1)
    retry: list[int] = dataclasses.field(default_factory=list)  # positions whose env failed: run again
    failures: int = 0  # failed episodes so far (env exceptions / step timeouts)


class Trainer:
    """Owns one run: its parts, its loop state and its run directory."""

    def __init__(self, config: Config, run_dir: Path):
        self.config = config
        self.run_dir = run_dir
        self.shop = build_shop(config)
        self.train_goals = list(self.shop.split("train"))
        self.eval_goals = list(self.shop.split(config.env.eval_split))[: config.env.eval_goals]
        if not self.train_goals:
            raise ConfigError("env: the shop has no train goals")
        if not self.eval_goals:
            raise ConfigError(f"env.eval_split: the shop has no {config.env.eval_split!r} goals")
        self.policy = build_policy(config, self.shop)
        self.agent = build_agent(config, self.policy)
        self.es_config = build_es_config(config)
        self.K = config.schedule.max_lag
        self.traces = config.run.traces == "eval"  # write every evaluation's episode traces
        from envs.webshop_bridge import EnvPool

        capacity = config.schedule.slots * config.env.tasks_per_member + len(self.eval_goals)
        self.pool = EnvPool(self.shop, capacity)
        self.engine = RolloutEngine(self.pool, self.agent, self.policy.config, self.es_config.noise,
                                    lambda v: float(self.es_config.sigma_at(v)), config.env.max_steps,
                                    config.agent.temperature, step_timeout=config.env.step_timeout_s)
        self.mesh = None
        self.sharded = None
        if config.mesh.distributed:
            raise ConfigError("mesh.distributed: the trainer runs on one host's devices for now; multi-process "
                              "runs are available through esjax.parallel (python -m esjax.parallel.smoke)")
        if len(jax.devices()) > 1:  # shard θ and its update over ('data', 'model'); rows over 'data'
            from esjax.parallel.sharded import ShardedES, mesh_from_config

            self.mesh = mesh_from_config(config.mesh)
            self.sharded = ShardedES(self.es_config, self.policy.config, self.mesh)
        self.es_update: ESUpdate | None = None
        self.coord: Coordinator | None = None
        self.jobs: dict[int, JobProgress] = {}
        self.evals: dict[int, Evaluation] = {}
        self.eval_params: dict[int, Any] = {}
        self.evaluated_versions: set[int] = set()
        self.next_eval_id = 0
        self.tick_count = 0
        self.busy_ticks = 0.0
        self.ticks_since_update = 0
        self.rows_since_update = 0
        self.tokens_since_update = 0
        self.episodes_since_update = 0
        self.wall_offset = 0.0
        self.nonfinite_rejections = 0
        self.constant_fitness_updates = 0  # updates whose cohort fitness was all equal (zero ES gradient)
        self.constant_fitness_streak = 0  # ... of the latest updates in a row (run.max_constant_fitness_updates)
        self.stopped_at: int | None = None  # the version the run stopped at before run.updates, if it did
        self.last_update_wall = 0.0
        self.finished = False  # the run ended: everything left was cancelled and the end record written
        self.restored_records: int | None = None  # metrics records a restored checkpoint had seen written
        self.writer: MetricsWriter | None = None
        self.checkpointer: Checkpointer | None = None
        self._progress: Progress | None = None

    # ----------------------------------------------------------------------------------------- set-up
    def _es_update(self, state: Any) -> ESUpdate:
        """The ES update the loop applies to each complete cohort: on a multi-device mesh, the sharded
        program (θ stays sharded)."""
        update_fn = None
        if self.sharded is not None:
            state = self.sharded.place(state)
            update_fn = self.sharded.update_fn
        return ESUpdate(self.es_config, state=state, keep=self.K + 1, update_fn=update_fn)

    def fresh(self) -> None:
        from esjax.es.step import init

        params = self.policy.params
        if self.sharded is not None:
            params = jax.device_put(params, self.sharded.shardings.params)
        self.es_update = self._es_update(init(self.es_config, params))
        self.coord = build_coordinator(self.config, len(self.train_goals))

    def params_at(self, version: int) -> Any:
        if version in self.eval_params:
            return self.eval_params[version]
        return self.es_update.params_at(version)

    @property
    def version(self) -> int:
        return self.coord.version

    # ----------------------------------------------------------------------------------------- checkpoint
    @property
    def last_version(self) -> int:
        """The version the run ends at: run.updates, or where it stopped early."""
        return self.config.run.updates if self.stopped_at is None else self.stopped_at

    def _needed_versions(self) -> list[int]:
        versions = {e.version for e in self.engine.live.values()}
        versions |= {v for v in self.coord.live_versions() if v <= self.version}
        # θ older than t - K is no longer kept and nothing dispatched there can still be accepted (at the end of a
        # run the coordinator still lists such jobs as in flight); evaluations keep their own copy of θ.
        versions = {v for v in versions if v >= self.version - self.K}
        versions |= {ev.version for ev in self.evals.values()}
        return sorted(v for v in versions if v != self.version)

    def loop_state(self) -> dict[str, Any]:
        return {
            "coordinator": self.coord.state_dict(),
            "saved_versions": self._needed_versions(),
            "episodes": [self.engine.live[row].to_dict() for row in sorted(self.engine.live)],
            "free_rows": list(self.engine.free_rows),
            "jobs": {str(jid): {"started_tick": jp.started_tick, "started": jp.started,
                                "rewards": {str(k): v for k, v in jp.rewards.items()},
                                "retry": list(jp.retry), "failures": jp.failures}
                     for jid, jp in sorted(self.jobs.items())},
            "evals": [ev.to_dict() for ev in self.evals.values()],
            "evaluated_versions": sorted(self.evaluated_versions),
            "next_eval_id": self.next_eval_id, "tick": self.tick_count, "busy_ticks": self.busy_ticks,
            "since_update": {"ticks": self.ticks_since_update, "rows": self.rows_since_update,
                             "tokens": self.tokens_since_update, "episodes": self.episodes_since_update},
            "wall_time": self.wall_time(), "nonfinite_rejections": self.nonfinite_rejections,
            "constant_fitness_streak": self.constant_fitness_streak, "stopped_at": self.stopped_at,
            "metrics_records": self.writer.count if self.writer is not None else None,
            "finished": self.finished,
        }

    def checkpoint_tree(self, saved_versions: list[int]) -> dict[str, Any]:
        return {"state": self.es_update.state,
                "versions": {str(v): self.params_at(v) for v in saved_versions}}

    def restore(self, checkpointer: Checkpointer) -> int:
        self.fresh()

        def target(loop: dict[str, Any]) -> dict[str, Any]:
            params = self.es_update.state.params
            return {"state": self.es_update.state, "versions": {str(v): params for v in loop["saved_versions"]}}

        step, tree, loop = checkpointer.restore_latest(target)
        self.es_update = self._es_update(tree["state"])
        saved = {int(v): p for v, p in tree["versions"].items()}
        for v, p in saved.items():
            if v >= self.es_update.version - self.K:
                self.es_update._params[v] = p  # θ of a live older version
        self.coord = build_coordinator(self.config, len(self.train_goals), loop["coordinator"])
        self.tick_count, self.busy_ticks = int(loop["tick"]), float(loop["busy_ticks"])
        since = loop.get("since_update", {})
        self.ticks_since_update, self.rows_since_update = int(since.get("ticks", 0)), int(since.get("rows", 0))
        self.tokens_since_update = int(since.get("tokens", 0))
        self.episodes_since_update = int(since.get("episodes", 0))
        self.wall_offset = float(loop["wall_time"])
        self.nonfinite_rejections = int(loop.get("nonfinite_rejections", 0))
        self.constant_fitness_streak = int(loop.get("constant_fitness_streak", 0))
        self.stopped_at = None if loop.get("stopped_at") is None else int(loop["stopped_at"])
        records = loop.get("metrics_records")
        self.restored_records = None if records is None else int(records)
        self.finished = bool(loop.get("finished", False))
        self.evaluated_versions = set(loop["evaluated_versions"])
        self.next_eval_id = int(loop["next_eval_id"])
        jobs_by_id = {job.job_id: job for job in self.coord.in_flight_jobs()}
        for jid, data in loop["jobs"].items():
            jp = JobProgress(jobs_by_id[int(jid)], int(data["started_tick"]),
                             {int(k): float(v) for k, v in data["rewards"].items()}, int(data["started"]),
                             [int(p) for p in data.get("retry", [])], int(data.get("failures", 0)))
            self.jobs[int(jid)] = jp
        for data in loop["evals"]:
            version = int(data["version"])
            self.eval_params[version] = saved[version] if version in saved else self.es_update.params_at(version)
            ev = Evaluation.from_dict(data, self.eval_goals, self.wall_offset)
            self.evals[ev.eval_id] = ev
        for data in loop["episodes"]:
            self.engine.start(data["kind"], int(data["owner"]), int(data["version"]), int(data["index"]),
                              int(data["goal"]), int(data["position"]), int(data["sampling_seed"]),
                              bool(data["greedy"]), data["trace"], row=int(data["row"]))
        self.engine.free_rows = [int(r) for r in loop["free_rows"]]  # same row order as the original run
        return step

    # ----------------------------------------------------------------------------------------- the loop
    def wall_time(self) -> float:
        return self.wall_offset + time.perf_counter() - self._wall_start

    def _start_eval(self, version: int) -> None:
        if version in self.evaluated_versions:
            return
        self.evaluated_versions.add(version)
        self.eval_params[version] = self.params_at(version)
        ev = Evaluation(self.next_eval_id, version, self.eval_goals, self.tick_count, self.wall_time())
        self.evals[ev.eval_id] = ev
        self.next_eval_id += 1

    def _fill(self) -> None:
        """Start episodes: evaluation rows first (they are few and fixed), then training jobs."""
        for ev in self.evals.values():
            while ev.retry and self.engine.free:
                p = ev.retry.pop(0)
                self.engine.start("eval", ev.eval_id, ev.version, 0, ev.goals[p], p,
                                  hash_ints(self.config.run.seed, 7919, ev.version), True)
            while ev.next_position < len(ev.goals) and self.engine.free:
                p = ev.next_position
                self.engine.start("eval", ev.eval_id, ev.version, 0, ev.goals[p], p,
                                  hash_ints(self.config.run.seed, 7919, ev.version), True)
                ev.next_position += 1
        if self.version < self.last_version:
            free_slots = self.config.schedule.slots - len(self.jobs)
            for job in self.coord.next_jobs(free_slots):
                self.jobs[job.job_id] = JobProgress(job, self.tick_count)
        per_member = self.config.env.tasks_per_member
        for jp in sorted(self.jobs.values(), key=lambda j: j.job.job_id):
            while (jp.retry or jp.started < per_member) and self.engine.free:
                if jp.retry:  # the same member, goal and sampling stream: a deterministic re-run
                    p = jp.retry.pop(0)
                else:
                    p = jp.started
                    jp.started += 1
                goal = self.train_goals[jp.job.tasks.goals[p] % len(self.train_goals)]
                self.engine.start("train", jp.job.job_id, jp.job.member.version, jp.job.member.index, goal, p,
                                  jp.job.tasks.sampling_seed, False)

    def _abandon_hopeless(self) -> None:
        """Jobs older than t − K can never be accepted: stop them now instead of finishing wasted work
        (discarded as 'abandoned'). Once the last update is applied, every job is cancelled."""
        done = self.version >= self.last_version
        floor = self.version - self.K
        stop = sorted(jid for jid, jp in self.jobs.items() if done or jp.job.member.version < floor)
        if not stop:
            return
        ids = set(stop)
        self.engine.stop(lambda e: e.kind == "train" and e.owner in ids)
        for jid in stop:
            jp = self.jobs.pop(jid)
            duration = float(self.tick_count - jp.started_tick)
            if done:
                self.coord.cancel(jid, duration)
            else:
                self.coord.abandon(jid, duration)

    def _write(self, record: dict[str, Any]) -> None:
        self.writer.write(record)

    def _apply_updates(self) -> None:
        """Complete cohorts come back from the coordinator, one at a time: apply the ES update to θ_t, advance
        the version, and give that version its own record, evaluation and checkpoint (a cascade of several
        updates is several such steps). Called once every finished job of the tick has been reported."""
        while self.version < self.last_version:
            cohort = self.coord.complete_cohort()
            if cohort is None:
                return
            try:
                metrics = self.es_update(cohort)
            except RejectedUpdate as err:  # θ_t and the optimizer state are unchanged; t stays
                self.coord.reject(str(err))
                self._drain_rejections()
                continue
            self._finish_update(self.coord.advance(metrics))

    def _finish_update(self, record) -> None:
        version = record.version + 1  # the version this update produced
        if version != self.version or version != self.es_update.version:
            raise RuntimeError(f"update record for version {version}, but the coordinator is at {self.version} "
                               f"and θ at {self.es_update.version}")
        summary = record.summary()
        now = self.wall_time()
        ticks = max(self.ticks_since_update, 1)
        lags = Counter(int(x) for x in record.cohort.lags)
        out = {"kind": "update", **summary, "version": version, "wall_time": now, "tick": self.tick_count,
               "lag_hist": {str(k): v for k, v in sorted(lags.items())},
               "slot_utilization": self.busy_ticks / ticks, "rows_per_tick": self.rows_since_update / ticks,
               "episodes_per_s": self.episodes_since_update / max(now - self.last_update_wall, 1e-9),
               "tokens_per_s": self.tokens_since_update / max(now - self.last_update_wall, 1e-9),
               "seconds": now - self.last_update_wall,
               # rollout time (ticks) of each accepted member, in acceptance order: the measured
               # episode-duration distribution that experiments/wallclock.py feeds to the simulator
               "durations": [float(d) for d in record.cohort.durations]}
        self._write(out)
        self._check_constant_fitness(record.cohort.fitness, version)
        self._progress.update(version, out, self.coord.totals())
        self.busy_ticks = 0.0
        self.ticks_since_update = self.rows_since_update = self.tokens_since_update = 0
        self.episodes_since_update = 0
        self.last_update_wall = now
        # Jobs dispatched before t - K can no longer be accepted (and θ of their version is no longer kept):
        # stop them at every version, checkpointed or not, so checkpoints never change the run.
        self._abandon_hopeless()
        last = self.last_version
        if version % self.config.run.eval_every == 0 or version == last:
            self._start_eval(version)
        if version % self.config.run.checkpoint_every == 0 or version == last:
            self._save()

    def _check_constant_fitness(self, fitness: Any, version: int) -> None:
        """A cohort whose (finite) fitnesses are all equal gives a zero ES gradient (no learning signal). Each such
        update gets a ``constant_fitness`` event record (counted in summary.md); the first one in this process
        also prints a warning."""
        values = np.asarray(fitness, np.float64)
        values = values[np.isfinite(values)]
        if len(values) >= 2 and values.max() > values.min():
            self.constant_fitness_streak = 0
            return
        self.constant_fitness_updates += 1
        self.constant_fitness_streak += 1
        value = float(values[0]) if len(values) else float("nan")
        self._write({"kind": "event", "event": "constant_fitness", "version": version, "at_version": version - 1,
                     "tick": self.tick_count, "wall_time": self.wall_time(), "fitness": value,
                     "members": len(values)})
        if self.constant_fitness_updates == 1:
            print(f"warning: update {version}: every member of the cohort has fitness {value:.4g}, so the ES "
                  "gradient is zero: no learning signal from it (every episode scoring the same: too few or too easy / "
                  "hard tasks per member, σ too small to change any action, or env.max_steps too short); "
                  "further such updates are counted in summary.md", file=sys.stderr, flush=True)
        limit = self.config.run.max_constant_fitness_updates
        if limit is not None and self.constant_fitness_streak >= limit:
            self.stopped_at = version
            reason = (f"{self.constant_fitness_streak} updates in a row had a constant cohort fitness "
                      f"(run.max_constant_fitness_updates={limit})")
            self._write({"kind": "event", "event": "stopped", "version": version, "tick": self.tick_count,
                         "wall_time": self.wall_time(), "reason": reason})
            print(f"stopping at version {version}: {reason}; the run ends with an evaluation and a checkpoint here",
                  file=sys.stderr, flush=True)

    def _save(self) -> None:
        """A checkpoint at the current version (only called at consistent points, see the module docstring)."""
        loop = self.loop_state()
        self.checkpointer.save(self.version, self.checkpoint_tree(loop["saved_versions"]), loop)

    def _finish_run(self) -> None:
        """Cancel what is left, write the end record with the coordinator's final totals and re-save the last
        checkpoint as finished (a resume of a finished run then has nothing to do)."""
        if self.finished:
            return
        totals = self.coord.close()
        self._write({"kind": "end", **totals, "version": self.version, "tick": self.tick_count,
                     "wall_time": self.wall_time(), "nonfinite_rejections": self.nonfinite_rejections})
        self.finished = True
        self._save()

    def _report(self, jid: int) -> None:
        jp = self.jobs.pop(jid)
        rewards = [jp.rewards[p] for p in range(self.config.env.tasks_per_member)]
        fitness = float(np.mean(rewards))
        self.coord.report(jp.job.result(fitness, float(self.tick_count - jp.started_tick)))

    def _event(self, event: str, **fields: Any) -> None:
        """An ``event`` record (env faults, rejected updates); ``version`` is t + 1: it belongs to the history
        leading to the next update."""
        self._write({"kind": "event", "event": event, "version": self.version + 1, "at_version": self.version,
                     "tick": self.tick_count, "wall_time": self.wall_time(), **fields})

    def _drain_rejections(self) -> None:
        """Updates the ES engine refused (θ would turn non-finite): θ and t were kept, the cohort dropped."""
        rejections, self.coord.rejections = self.coord.rejections, []
        for rejection in rejections:
            self.nonfinite_rejections += 1
            self._event("nonfinite_update", rejected=self.nonfinite_rejections,
                        members=len(rejection["members"]), reason=rejection["reason"])
            limit = max(1, self.config.run.max_nonfinite_updates)
            if self.nonfinite_rejections >= limit:
                raise RunAborted(f"stopping: {self.nonfinite_rejections} updates rejected because they would make "
                                 f"the parameters non-finite (run.max_nonfinite_updates={limit}); θ stays at "
                                 f"version {self.version}, the last checkpoint is intact")

    def run(self, writer: MetricsWriter, checkpointer: Checkpointer, progress: Progress) -> None:
        self.writer, self.checkpointer, self._progress = writer, checkpointer, progress
        self._wall_start = time.perf_counter()
        self.last_update_wall = self.wall_time()
        if self.finished and self.version < self.config.run.updates:  # resumed with a larger run.updates, or
            self.finished = False  # after an early stop: go on
            self.stopped_at, self.constant_fitness_streak = None, 0
        if self.finished:
            return
        if self.version == 0 and not self.evaluated_versions:
            self._start_eval(0)
        self._apply_updates()  # a checkpoint taken inside a cascade holds the next complete cohort
        while self.version < self.last_version or self.evals or self.jobs:
            self._abandon_hopeless()
            self._fill()
            if not self.engine.live:
                if self.version >= self.last_version and not self.evals:
                    break
                raise RuntimeError(f"the loop stalled at version {self.version}: no episode is live "
                                   f"(schedule {self.config.schedule.kind!r}, {len(self.jobs)} jobs)")
            self.busy_ticks += len(self.jobs) / self.config.schedule.slots
            finished, stats = self.engine.tick(self.params_at)
            if self.traces and self.evals:
                self._observe_evals(finished)
            self.tick_count += 1
            self._progress.phase(self._phase())
            self.ticks_since_update += 1
            self.rows_since_update += stats.rows
            self.tokens_since_update += stats.tokens
            done_jobs = []
            for episode in finished:
                self._episode_done(episode, done_jobs)
            for jid in sorted(done_jobs):  # every finished job is reported before any update is applied
                if jid in self.jobs:
                    self._report(jid)
            self._apply_updates()
        self._finish_run()

    def _phase(self) -> str:
        """What the loop is waiting for, for the live progress line."""
        parts = []
        if self.version < self.last_version:
            parts.append(f"update {self.version + 1}: {self.coord.cohort_size()}/{self.coord.population} "
                         "members in")
        parts += [f"eval v{ev.version} {len(ev.rewards)}/{len(ev.goals)} goals" for ev in self.evals.values()]
        return " · ".join(parts) or "finishing"

    def _episode_failed(self, episode: Episode) -> None:
        """The env raised or hung in this episode: re-run it (same member, goal and sampling stream) up to
        ``env.max_retries`` times per job, then drop the job (counted by the coordinator as abandoned)."""
        retries = self.config.env.max_retries
        fields = {"owner_kind": episode.kind, "member": [episode.version, episode.index],
                  "position": episode.position, "goal": episode.goal, "step": episode.steps,
                  "reason": episode.failure}
        if episode.kind == "eval":
            ev = self.evals[episode.owner]
            ev.failures += 1
            if ev.failures <= retries:
                ev.retry.append(episode.position)
                self._event("env_fault", action="retry", **fields)
            else:  # an evaluation episode past the retry limit scores 0
                ev.rewards[episode.position] = 0.0
                self._event("env_fault", action="scored_zero", **fields)
            return
        jp = self.jobs.get(episode.owner)
        if jp is None:
            return
        jp.failures += 1
        if jp.failures <= retries:
            jp.retry.append(episode.position)
            self._event("env_fault", action="retry", **fields)
            return
        self._event("env_fault", action="drop_job", **fields)
        self.engine.stop(lambda e: e.kind == "train" and e.owner == episode.owner)
        self.jobs.pop(episode.owner)
        self.coord.abandon(episode.owner, float(self.tick_count - jp.started_tick))

    def _episode_done(self, episode: Episode, done_jobs: list[int]) -> None:
        if episode.failure is not None:
            self._episode_failed(episode)
            if episode.kind == "eval":
                ev = self.evals[episode.owner]
                if episode.position in ev.rewards:  # past the retry limit: scored 0, traced with its failure
                    self._trace_eval(ev, episode)
                else:  # run again from the start
                    ev.recorder.forget(episode.position)
                self._maybe_finish_eval(ev)
            return
        if episode.kind == "eval":
            ev = self.evals[episode.owner]
            ev.rewards[episode.position] = episode.reward
            self._trace_eval(ev, episode)
            self._maybe_finish_eval(ev)
            return
        jp = self.jobs.get(episode.owner)
        if jp is None:
            return
        self.episodes_since_update += 1
        jp.rewards[episode.position] = episode.reward
        if len(jp.rewards) == self.config.env.tasks_per_member:
            done_jobs.append(episode.owner)

    def _observe_evals(self, finished: list[Episode]) -> None:
        """run.traces: the page each evaluation episode's latest action led to (a snippet), after every tick."""
        for episode in (*self.engine.live.values(), *finished):
            if episode.kind == "eval" and episode.owner in self.evals:
                self.evals[episode.owner].recorder.observe(episode.position, episode)

    def _trace_eval(self, ev: Evaluation, episode: Episode) -> None:
        if self.traces:
            ev.traces[episode.position] = ev.recorder.line(
                episode.position, episode, ev.rewards[episode.position], self.config.env.max_steps,
                version=ev.version, position=episode.position)

    def _maybe_finish_eval(self, ev: Evaluation) -> None:
        if ev.complete:
            if self.traces:  # written before the record: a record in metrics.jsonl means its traces exist
                write_traces(self.run_dir / "traces" / f"eval-v{ev.version}.jsonl",
                             (ev.traces[p] for p in sorted(ev.traces)))
            record = ev.record(self.wall_time())
            self._write(record)
            self.evals.pop(ev.eval_id)
            if not any(e.version == ev.version for e in self.evals.values()):
                self.eval_params.pop(ev.version, None)
            self._progress.eval(record)


# ---------------------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------------------


def default_run_dir(config: Config) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{config.run.name}-{stamp}"


def resume_config(run_dir: str | Path, overrides: list[str] | None = None) -> Config:
    """The config a run was started with (``--set`` may change only non-structural keys)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: not a run directory (no {CONFIG_FILE})")
    return load_config(path, overrides)


def load_run(run_dir: str | Path, config: Config | None = None) -> tuple[Any, LoadedPolicy, Any, int]:
    """(shop, policy, θ of the latest readable checkpoint, its version) of a run directory."""
    config = config or resume_config(run_dir)
    shop = build_shop(config)
    policy = build_policy(config, shop)
    state = ESUpdate(build_es_config(config), policy.params).state
    checkpointer = Checkpointer(run_dir, config.run.keep_checkpoints)
    try:
        def target(loop: dict[str, Any]) -> dict[str, Any]:
            return {"state": state, "versions": {str(v): state.params for v in loop["saved_versions"]}}

        _, tree, _ = checkpointer.restore_latest(target)
    finally:
        checkpointer.close()
    return shop, policy, tree["state"].params, int(tree["state"].version)


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    version: int
    params: Any
    records: list[dict[str, Any]]
    totals: dict[str, Any] = dataclasses.field(default_factory=dict)  # the coordinator's final totals


class RunDirError(UserError):
    """The run directory cannot be used (e.g. the path names a regular file)."""


def storage_reason(err: OSError) -> str:
    """``[Errno 30] Read-only file system: 'path'`` as one short line."""
    text = f"{err.strerror}: {err.filename}" if err.strerror and err.filename else str(err)
    return text.splitlines()[0][:300] if text else err.__class__.__name__


def enable_compilation_cache(path: str | None) -> None:
    """Reuse compiled programs across runs (an explicit JAX_COMPILATION_CACHE_DIR wins). Best effort: a
    cache folder that cannot be created (read-only home) only costs compile time."""
    import os
    import warnings

    if path is None or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as err:
        warnings.warn(f"run.compilation_cache: {path!r} cannot be used ({err.__class__.__name__}); compiling "
                      "without a persistent cache", RuntimeWarning, stacklevel=2)
        return
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _prepare_run_dir(run_dir: Path, resume: bool) -> Path | None:
    """Make sure ``run_dir`` is a usable directory (creating it and its parents for a new run). Returns the
    top-most folder this call created (removed again if the start fails), or None."""
    what = "--resume" if resume else "--run-dir / run.run_dir"
    try:
        if run_dir.exists() and not run_dir.is_dir():
            raise RunDirError(f"{run_dir}: the run directory ({what}) exists and is not a directory")
        if run_dir.is_dir():
            return None
        if resume:
            raise RunDirError(f"{run_dir}: the run directory ({what}) does not exist")
        top = run_dir  # the top-most folder this call creates
        while not top.parent.exists() and top.parent != top:
            top = top.parent
        run_dir.mkdir(parents=True, exist_ok=True)
        return top
    except OSError as err:
        raise StorageError(f"{run_dir}: cannot create the run directory ({what}): {storage_reason(err)}") from None
    except ValueError as err:  # an embedded NUL byte and the like
        raise RunDirError(f"{str(run_dir)[:200]!r}: not a usable run directory ({what}): {err}") from None


def check_extras(config: Config) -> None:
    """Optional packages the config needs, checked before anything is built: one line naming the extra."""
    for key, module, extra in (("tensorboard", "tensorboardX", "tb"), ("wandb", "wandb", "wandb")):
        if getattr(config.run, key):
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(f"run.{key}: true needs the optional {module} package, which is not installed: "
                                  f"pip install 'esjax[{extra}]' (or --set run.{key}=false)") from None


def resume_command(run_dir: Path, overrides: list[str] | None = None) -> str:
    """The shell command that resumes ``run_dir`` with the same ``--set`` overrides."""
    parts = ["python", "-m", "esjax.run", "--resume", str(run_dir)]
    for item in overrides or []:
        parts += ["--set", item]
    return shlex.join(parts)


def _interrupted(run_dir: Path, version: int, steps: list[int], checkpoint_every: int, removed: bool,
                 resume_overrides: list[str] | None) -> RunInterrupted:
    if removed:
        return RunInterrupted(f"interrupted before the first update: no checkpoint was written and the new run "
                              f"directory {run_dir} was removed", run_dir, None, removed=True)
    command = resume_command(run_dir, resume_overrides)
    if steps:
        latest = steps[-1]
        where = run_dir.absolute() / "checkpoints" / str(latest)
        return RunInterrupted(f"interrupted at version {version}; latest checkpoint: version {latest} ({where})\n"
                              f"resume with: {command}", run_dir, latest)
    return RunInterrupted(f"interrupted at version {version}, before the first checkpoint (run.checkpoint_every="
                          f"{checkpoint_every}): no checkpoint exists, a resume starts the run over\n"
                          f"resume with: {command}", run_dir, None)


def train(config: Config, run_dir: str | Path | None = None, resume: bool = False,
          overrides: list[str] | None = None) -> TrainResult:
    """Run (or resume) a training job and write its run directory; returns the final θ and records.

    ``overrides``: the ``--set`` items of the command line (recorded in run.json and summary.md).

    A start that fails (bad input found while building the parts, a run directory that cannot be written, a
    missing optional package, a failure or Ctrl-C before the first update) raises a one-line error and leaves
    no new run directory behind. Ctrl-C later raises :class:`RunInterrupted`, whose message names the latest
    checkpoint and the command that resumes from it.
    """
    run_dir = Path(run_dir or config.run.run_dir or default_run_dir(config))
    check_extras(config)
    created = _prepare_run_dir(run_dir, resume)
    if config.run.progress:
        print(f"{'resuming' if resume else 'writing'} the run in {run_dir}: loading the shop and the policy",
              flush=True)
    checkpointer = writer = None
    try:
        enable_compilation_cache(config.run.compilation_cache)
        if not resume:
            (run_dir / CONFIG_FILE).write_text(config_to_yaml(config))
            (run_dir / "run.json").write_text(json.dumps(run_metadata(config, overrides), indent=2))
        trainer = Trainer(config, run_dir)
        checkpointer = Checkpointer(run_dir, config.run.keep_checkpoints)
        metrics_path = run_dir / "metrics.jsonl"
        if resume and checkpointer.steps():
            step = trainer.restore(checkpointer)
            if trainer.restored_records is not None:  # drop what was written after the checkpoint
                truncate_records(metrics_path, trainer.restored_records)
            else:  # a checkpoint from before record counting
                truncate_after(metrics_path, step)
        else:
            if resume:
                metrics_path.unlink(missing_ok=True)
            trainer.fresh()
        wandb = None
        if config.run.wandb:
            wandb = {"project": config.run.wandb_project, "name": run_dir.name, "config": config.model_dump()}
        writer = MetricsWriter(run_dir, config.run.tensorboard, wandb)
        if resume:
            _record_resume(run_dir, overrides)
    except BaseException as err:
        for part in (writer, checkpointer):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.close()
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(err, OSError):
            raise StorageError(f"{run_dir}: cannot write the run ({storage_reason(err)})") from None
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, RunInterrupted):
            where = (f"the new run directory {run_dir} was removed" if created is not None
                     else f"{run_dir} is unchanged")
            raise RunInterrupted(f"interrupted during start-up: nothing was trained, {where}", run_dir, None,
                                 removed=created is not None) from None
        raise
    progress = Progress(config.run.updates, enabled=config.run.progress)
    failed, interrupted, removed = True, False, False
    steps: list[int] = []
    try:
        with progress, (jax.set_mesh(trainer.mesh) if trainer.mesh is not None else contextlib.nullcontext()):
            trainer.run(writer, checkpointer, progress)
        records = read_metrics(run_dir / "metrics.jsonl")
        from esjax.plots import write_plots, write_summary

        run_info = read_run_info(run_dir)
        write_plots(records, run_dir / "plots", plot_title(config, run_info))
        summary = write_summary(records, run_dir / "summary.md", f"{config.run.name}: {config.schedule.kind} ES",
                                run_info=run_info)
        failed = False
    except OSError as err:  # a full or read-only disk under the run directory: stop, keep the last checkpoint
        raise StorageError(f"{run_dir}: cannot write the run ({storage_reason(err)}); stopped at version "
                           f"{trainer.version}, the last complete checkpoint is kept") from None
    except KeyboardInterrupt:
        interrupted = True  # reported below, once the files are closed
    finally:
        with contextlib.suppress(Exception):
            steps = checkpointer.steps()
        for close in (writer.close, checkpointer.close):
            with contextlib.suppress(OSError):
                close()
        # A failure (or Ctrl-C) before the first update of a new run is a failed start: nothing to resume.
        if failed and created is not None and not steps and trainer.version == 0:
            shutil.rmtree(created, ignore_errors=True)
            removed = True
    if interrupted:
        raise _interrupted(run_dir, trainer.version, steps, config.run.checkpoint_every, removed,
                           overrides if resume else None) from None
    progress.final(summary, records)
    if config.run.progress:
        print(f"run directory: {run_dir} (summary.md, plots/, metrics.jsonl, checkpoints/)", flush=True)
    return TrainResult(run_dir, trainer.version, trainer.es_update.state.params, records, trainer.coord.totals())
