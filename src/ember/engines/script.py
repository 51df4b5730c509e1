"""What the user's script must be for the local engine's spawned processes, which import it
again as __mp_main__: ember's call under its main guard (so the workers do not call it
again), and every class or function it hands the workers defined outside that guard (so the
workers find it). Either is one clear error before anything starts."""

from __future__ import annotations

import ast
import io
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import FrameType, FunctionType
from typing import Any

from ember.errors import ConfigError


def require_main_guard(caller: str, spawned: str) -> None:
    """Refuse a call from a script's top-level code outside `if __name__ == "__main__":`,
    before anything starts: the spawned processes import the script again and would call
    it again. In such a process (importing the script as __mp_main__) exit with that line."""
    main = sys.modules.get("__main__")
    main_globals = getattr(main, "__dict__", None)
    frame: FrameType | None = sys._getframe(1)
    outer = None
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            if frame.f_globals.get("__name__") == "__mp_main__":
                raise SystemExit(
                    _unguarded(caller, spawned, frame.f_code.co_filename, frame.f_lineno)
                )
            if frame.f_globals is main_globals:
                outer = frame  # the outermost one wins: that is the script's own code
        frame = frame.f_back
    path = getattr(main, "__file__", None)
    tree = _script_tree()  # None: a REPL, python -c, a notebook, which nothing re-imports
    if outer is None or not path or tree is None:
        return
    if not any(_guards(node, outer.f_lineno) for node in ast.walk(tree)):
        raise ConfigError(_unguarded(caller, spawned, path, outer.f_lineno))


def _guards(node: ast.AST, line: int) -> bool:
    """Whether `node` is `if __name__ == "__main__":` (either way round) whose body holds line."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.comparators) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = {ast.unparse(test.left), ast.unparse(test.comparators[0])}
    if sides != {"__name__", "'__main__'"}:
        return False
    return node.body[0].lineno <= line <= (node.body[-1].end_lineno or line)


def _unguarded(caller: str, spawned: str, path: str, line: int) -> str:
    script = Path(path).name
    return (
        f"{caller} was called at the top level of {script} (line {line}); {spawned}"
        f" are spawned processes that import {script} again, so put the call under"
        ' `if __name__ == "__main__":`'
    )


def check_picklable(source: object, what: str = "model") -> None:
    """The local engine hands a model, loss or metric object (or ember.run's function) to its
    worker processes as multiprocessing hands any argument: one it cannot is refused here,
    before anything starts, and so is one whose class or function the script defines under
    its main guard, which the workers' import of the script never runs."""
    names = _MainNames(io.BytesIO())
    try:
        names.dump(source)
    except Exception as exc:
        raise ConfigError(
            f"{what} {source!r} cannot be handed to the local engine's workers ({exc}); define"
            " it at the top level of a module or of the script"
        ) from None
    for name in names.found:
        line = _guarded_definition(name)
        if line is not None:
            script = Path(getattr(sys.modules["__main__"], "__file__", "")).name
            raise ConfigError(
                f"{what}: {name} is defined under the main guard of {script} (line {line}),"
                f" which the local engine's workers do not run when they import {script}:"
                f" define {name} at the top level of the script, not under its main guard"
            )


class _MainNames(ForkingPickler):
    """A pickler that notes each class and function of the script (__main__) it pickles by
    name: what a worker must find again when it imports the script."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        self.found: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, FunctionType)) and obj.__module__ == "__main__":
            self.found.append(obj.__qualname__.split(".")[0])
        return NotImplemented


def _guarded_definition(name: str) -> int | None:
    """The line where the script defines `name` inside `if __name__ == "__main__":`, when
    it defines it nowhere outside one; None otherwise (or where its source cannot be read)."""
    tree = _script_tree()
    if tree is None:
        return None
    guarded = None
    definitions = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = list(ast.walk(tree))  # walked once, not once for each definition of the name
    for node in nodes:
        if isinstance(node, definitions) and node.name == name:
            if not any(_guards(g, node.lineno) for g in nodes):
                return None
            guarded = node.lineno
    return guarded


def _script_tree() -> ast.Module | None:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:  # a REPL, python -c, a notebook: nothing is imported again
        return None
    try:
        return ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None


class ShippedLoop:
    """ember.run's function and its arguments as TorchDistributor ships them: cloudpickled,
    so that a closure, a lambda or a function the script defines under its main guard reaches
    the local engine's workers too (a function a module defines travels by name, as ever).
    The bytes go from the launcher to its own workers through the fork server, as
    multiprocessing hands any argument; never over a socket of ember's wire."""

    def __init__(self, function: Any, args: tuple[Any, ...]) -> None:
        import cloudpickle

        try:
            self.payload = cloudpickle.dumps((function, args))
        except Exception as exc:
            raise ConfigError(
                f"train_fn {function!r} or its arguments cannot be handed to the local"
                f" engine's workers ({type(exc).__name__}: {exc})"
            ) from None
        self.name = getattr(function, "__qualname__", type(function).__name__)

    def __call__(self) -> Any:
        import cloudpickle

        function, args = cloudpickle.loads(self.payload)
        return function(*args)

    def __repr__(self) -> str:
        return f"<ember.run's {self.name}>"
