"""Run configuration: YAML files validated into typed objects before anything compiles.

Every user mistake (unknown key, wrong type, impossible combination, missing model folder) becomes a
:class:`ConfigError` whose one-line message names the file, the dotted key and what was expected, so the
CLI can print it and exit non-zero without a traceback.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
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
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Section):
    """What the job is: seed, length, cadence of evaluation and checkpoints, where it writes."""

    name: str = "esjax"
    seed: int = 0
    updates: int = Field(20, ge=1, description="number of ES updates to apply")
    eval_every: int = Field(10, ge=1, description="evaluate the unperturbed policy every E updates")
    checkpoint_every: int = Field(5, ge=1, description="orbax checkpoint every C updates (and at the end)")
    keep_checkpoints: int = Field(3, ge=1)
    run_dir: str | None = Field(None, description="default: runs/<name>-<timestamp>")
    deterministic: bool = Field(True, description="fixed tick order: bit-identical reruns")
    tensorboard: bool = False
    progress: bool = True
    compilation_cache: str | None = Field(
        "~/.cache/esjax/xla", description="persistent XLA compilation cache (null: off); reruns start faster")
    max_nonfinite_updates: int = Field(
        10, ge=0, description="an update that would make θ non-finite is rejected (θ kept, cohort dropped, "
                              "event logged); the run stops once this many were rejected (0: at the first)")


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


class ESSection(_Section):
    """The ES estimator and step."""

    population: int = Field(8, ge=2, description="N: accepted members per update")
    antithetic: bool = True
    mode: Literal["full", "lowrank"] = "lowrank"
    rank: int = Field(1, ge=1)
    sigma: float = Field(0.02, gt=0)
    sigma_final: float | None = Field(None, gt=0, description="end value for linear/cosine schedules")
    sigma_schedule: Literal["constant", "linear", "cosine"] = "constant"
    learning_rate: float = Field(0.01, gt=0)
    scale: Literal["nes", "llm"] = Field("nes", description="nes: 1/(N sigma); llm: 1/N, sigma folded into lr")
    shaping: Literal["centered_ranks", "z_score", "raw"] = "centered_ranks"
    optimizer: Literal["sgd", "adam"] = "sgd"
    weight_decay: float = Field(0.0, ge=0)
    anchor_decay: float = Field(0.0, ge=0, description="decay toward the initial weights")
    scope: Literal["matrices", "all"] = "matrices"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> ESSection:
        if self.antithetic and self.population % 2:
            raise ValueError(f"es.population: must be even with es.antithetic=true, got {self.population}")
        if self.sigma_schedule != "constant" and self.sigma_final is None:
            raise ValueError(f"es.sigma_final: required with es.sigma_schedule={self.sigma_schedule!r}")
        return self


class ScheduleSection(_Section):
    """How fitness is gathered: sync barrier, natural async, controlled staleness, stress tests."""

    kind: Literal["sync", "async", "controlled", "all_stale", "extreme_lag"] = "async"
    max_lag: int = Field(1, ge=0, description="K: accept a fitness measured at version v iff t - v <= K")
    lag: int = Field(0, ge=0, description="k for controlled / all_stale")
    stale_fraction: float = Field(0.0, ge=0, le=1, description="p for controlled")
    slots: int = Field(8, ge=1, description="concurrent member rollouts (G workers)")

    @model_validator(mode="after")
    def _check(self) -> ScheduleSection:
        if self.kind in ("controlled", "all_stale") and self.lag > self.max_lag:
            raise ValueError(f"schedule.lag: {self.lag} exceeds schedule.max_lag={self.max_lag}")
        if self.kind == "all_stale" and self.lag < 1:
            raise ValueError("schedule.lag: all_stale needs lag >= 1")
        return self


class EnvSection(_Section):
    """Where episodes come from."""

    data: str = Field("synthetic", description="'synthetic', 'webshop_small' (the packaged real 1,000-product set) "
                                               "or a folder with WebShop data files")
    num_products: int = Field(300, ge=10, description="synthetic catalog size")
    catalog_seed: int = 0
    tasks_per_member: int = Field(4, ge=1, description="goals in each version's task batch")
    max_steps: int = Field(10, ge=1, description="episode step cap")
    eval_goals: int = Field(200, ge=1, description="held-out goals per evaluation")
    eval_split: Literal["test", "eval", "train"] = "test"
    step_timeout_s: float | None = Field(
        60.0, gt=0, description="an env step taking longer fails its episode (null: no limit); failed "
                                "episodes (timeouts or exceptions) are re-run up to env.max_retries times")
    max_retries: int = Field(2, ge=0, description="re-runs of a member's failed episodes before its job is "
                                                  "dropped (counted as 'abandoned')")

    @model_validator(mode="after")
    def _check(self) -> EnvSection:
        from envs.webshop_bridge.shop import PACKAGED_DATA

        if self.data not in ("synthetic", *PACKAGED_DATA) and _path_problem(self.data, "any") is not None:
            raise ValueError(f"env.data: {self.data[:200]!r} {_path_problem(self.data, 'any')} "
                             f"(expected 'synthetic', {', '.join(map(repr, PACKAGED_DATA))} or a data folder)")
        return self


class AgentSection(_Section):
    """How the policy picks actions: by scoring each valid action's description (see esjax.agent.webshop)."""

    prompt_style: Literal["auto", "compact", "chat"] = Field(
        "auto", description="compact one-line state, or the full observation in the chat template; "
                            "auto = chat when the model has a chat template and is not the embedded policy")
    temperature: float = Field(1.0, ge=0, description="sampling temperature over candidate scores; 0 = greedy")
    max_prompt_tokens: int = Field(512, ge=16)
    max_candidate_tokens: int = Field(32, ge=1)


class MeshSection(_Section):
    """Device mesh ('data', 'model'); 0 means all devices on that axis."""

    data: int = Field(0, ge=0)
    model: int = Field(1, ge=1)
    distributed: bool = Field(False, description="call jax.distributed.initialize from the environment")


class Config(_Section):
    """A whole run."""

    run: RunSection = RunSection()
    model: ModelSection = ModelSection()
    es: ESSection = ESSection()
    schedule: ScheduleSection = ScheduleSection()
    env: EnvSection = EnvSection()
    agent: AgentSection = AgentSection()
    mesh: MeshSection = MeshSection()


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


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
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {text!r}: value is not valid YAML ({err.__class__.__name__})") from err
    return key.strip(), value


def _format_validation_error(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(part) for part in first["loc"])
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        return f"{source}: unknown key {loc!r}"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        # Validators name their own key ("es.population: ..."); keep that form.
        return f"{source}: {msg}" if ":" in msg.split(" ")[0] else f"{source}: {loc}: {msg}"
    got = first.get("input")
    got_text = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{source}: {loc}: {msg}{got_text}"


def config_from_dict(raw: dict[str, Any], source: str = "<config>") -> Config:
    """Validate a plain dict into a :class:`Config`, raising :class:`ConfigError` on any problem."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A config file as a dict, with ``extends: OTHER.yaml`` (relative to the file) merged underneath."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends: expected a file name, got {parent!r}")
    parent_file = (file.parent / parent).resolve()
    if parent_file in _seen:
        raise ConfigError(f"{path}: extends: {parent} forms a cycle")
    return _deep_merge(read_yaml(parent_file, (*_seen, file.resolve())), raw)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML config file (or defaults when ``path`` is None) and apply ``--set`` overrides."""
    source = str(path) if path is not None else "<defaults>"
    raw: dict[str, Any] = read_yaml(path) if path is not None else {}
    for text in overrides or []:
        key, value = parse_override(text)
        _set_dotted(raw, key, value, source)
    return config_from_dict(raw, source)


def config_to_yaml(config: Config) -> str:
    """The resolved config, as written into every run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
