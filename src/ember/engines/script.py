"""What the user's script must be for the local engine's spawned processes, which import it
again as __mp_main__: ember's call under its main guard (so the workers do not call it
again), and what it hands the workers picklable. Either is one clear error before anything
starts."""

from __future__ import annotations

import ast
import sys
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from types import FrameType

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
    before anything starts."""
    try:
        ForkingPickler.dumps(source)
    except Exception as exc:
        raise ConfigError(
            f"{what} {source!r} cannot be handed to the local engine's workers ({exc}); define"
            " it at the top level of a module (or of the script, under its main guard)"
        ) from None


def _script_tree() -> ast.Module | None:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:  # a REPL, python -c, a notebook: nothing is imported again
        return None
    try:
        return ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
