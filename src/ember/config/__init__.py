"""Validated run configuration: the one place for defaults and error messages. The strategies
it names, and what each implies, are in ember.config.strategies (re-exported here).

imports: errors
"""

from ember.config.files import did_you_mean, explicit_fields, fresh_config, make_config
from ember.config.parts import (
    PARTS,
    DataPart,
    EnginePart,
    RunParts,
    ServerSettings,
    ServersPart,
    StrategyPart,
    TrainingPart,
    part_of,
)
from ember.config.resume import RESUME_MAY_CHANGE, resumed_values
from ember.config.run import (
    CODECS,
    DILOCO_TAU,
    ENGINES,
    FIELD_NAMES,
    MAX_WORKERS,
    RunConfig,
)
from ember.config.strategies import STRATEGIES, AlgorithmKind, ConsistencyKind, Strategy

__all__ = [
    "CODECS",
    "DILOCO_TAU",
    "ENGINES",
    "FIELD_NAMES",
    "MAX_WORKERS",
    "PARTS",
    "RESUME_MAY_CHANGE",
    "STRATEGIES",
    "AlgorithmKind",
    "ConsistencyKind",
    "DataPart",
    "EnginePart",
    "RunConfig",
    "RunParts",
    "ServerSettings",
    "ServersPart",
    "Strategy",
    "StrategyPart",
    "TrainingPart",
    "did_you_mean",
    "explicit_fields",
    "fresh_config",
    "make_config",
    "part_of",
    "resumed_values",
]
