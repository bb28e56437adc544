"""The run configuration: its schema (:mod:`.schema`, one typed section per part of a run) and loading YAML files
and ``--set`` overrides into it with one-line errors (:mod:`.loading`)."""

from esjax.config.loading import (
    Origins,
    config_from_dict,
    config_to_yaml,
    key_paths,
    load_config,
    parse_override,
    read_yaml,
)
from esjax.config.schema import (
    DEFAULT_SCHEDULE,
    MAX_CONCURRENT_EPISODES,
    MAX_SEED,
    AdamOptimizer,
    AgentSection,
    AllStaleSchedule,
    AsyncSchedule,
    Config,
    ConfigError,
    ControlledSchedule,
    EnvSection,
    ESSection,
    ExtremeLagSchedule,
    MeshSection,
    ModelSection,
    OptimizerSection,
    RunSection,
    ScheduleSection,
    SGDOptimizer,
    SyncSchedule,
    env_section,
)

__all__ = [
    "DEFAULT_SCHEDULE", "MAX_CONCURRENT_EPISODES", "MAX_SEED", "AdamOptimizer", "AgentSection",
    "AllStaleSchedule", "AsyncSchedule", "Config", "ConfigError", "ControlledSchedule", "ESSection", "EnvSection",
    "ExtremeLagSchedule", "MeshSection", "ModelSection", "OptimizerSection", "Origins", "RunSection",
    "SGDOptimizer", "ScheduleSection", "SyncSchedule", "config_from_dict", "config_to_yaml", "env_section",
    "key_paths", "load_config", "parse_override", "read_yaml",
]
