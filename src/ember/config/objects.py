"""What a run was handed as Python objects in place of names: a model (config.model is then
its label), and losses, metrics, optimizers and schedules under theirs. One value, built at
the edge (ember.fit, ember.run, ember.spark.fit) and handed down with the run: each engine
ships it to its own processes as it ships code (multiprocessing, Spark's closures), never
over ember's wire, and every place that builds a model or a function from a name asks it."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OBJECT_PREFIX = "object:"  # the label of what a run was handed as an object


@dataclass(frozen=True)
class UserObjects:
    model: Any = None  # an nn.Module (copied) or a callable returning one
    # by label; a dict, which every engine can ship (a mapping proxy cannot be pickled)
    functions: Mapping[str, Any] = field(default_factory=dict)

    def model_for(self, label: str) -> Any:
        """The model object `label` names, or None for a name or a factory."""
        return self.model if label.startswith(OBJECT_PREFIX) else None

    def function(self, label: str) -> Any:
        """The loss, metric, optimizer or schedule object `label` names, or None."""
        return self.functions.get(label)

    def sources(self, model_label: str) -> dict[str, str]:
        """Where each object is defined, by its label, as "module:Name" (a script as its
        file's name): what `ember evaluate --model` or `--loss` imports it by again."""
        model = {model_label: self.model} if self.model is not None else {}
        return {label: defined_at(source) for label, source in {**self.functions, **model}.items()}


NO_OBJECTS = UserObjects()


def _named_by(source: object) -> Any:  # a function or class itself; an instance's class
    return source if isinstance(source, type) or inspect.isroutine(source) else type(source)


def defined_at(source: object) -> str:
    """The "module:Name" of a function or class, or of an instance's class."""
    kind = _named_by(source)
    module = getattr(kind, "__module__", None) or "?"
    if module in ("__main__", "__mp_main__"):  # the script: importable by its file's name
        script = getattr(sys.modules.get(module), "__file__", None)
        module = Path(script).stem if script else module
    return f"{module}:{getattr(kind, '__qualname__', type(source).__name__)}"


def model_label(source: object) -> str:
    """The label config.model carries for a model object: the name of its class (a module
    instance) or of the function or class that builds it."""
    kind = _named_by(source)
    return OBJECT_PREFIX + getattr(kind, "__qualname__", type(source).__name__)


def object_label(kind: str, source: object) -> str:
    """The label a loss, metric, optimizer or schedule object travels under in the run's
    configuration."""
    name = getattr(source, "__qualname__", None) or type(source).__qualname__
    return f"{OBJECT_PREFIX}{kind}:{getattr(source, '__module__', '?')}.{name}"
