"""The package's shape, read from its source with `ast`: import directions, where zmq and
pyspark may be imported, and a ceiling on module size."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ember"
MAX_LINES = 400

# The parts of the package, lowest first. A part may import any part of a lower layer and
# nothing of its own layer but itself, so the dependency direction of docs/architecture.md
# (leaves <- wire <- ps <- algorithms <- worker <- engines <- bench, cli) cannot be reversed.
LAYERS: list[set[str]] = [
    {"_version", "errors", "metrics", "userfile"},
    {
        "network",
        "tau",
        "training",
        "objective",
        "flags",
        "strategies",
        "units",
        "returns",
        "devices",
    },
    {"tracking"},
    {"config"},
    {"wire", "data", "checkpoint", "perfmodel", "emulated"},
    {"models", "devicework"},
    {"plan", "spec"},
    {"ps"},
    {"algorithms"},
    {"evaluation", "export", "workerdata"},
    {"userloop"},
    {"worker", "predictions"},
    {"engines"},
    {"api"},
    {"runs"},
    {"spark"},
    {"spark_ml"},
    {"bench"},
    {"cli"},
    {"__init__", "__main__"},
]
PARTS = set().union(*LAYERS)
# Third-party packages only some parts may import.
CONFINED = {
    "zmq": ("wire",),
    "mlflow": ("tracking.py",),
    "pyspark": (
        "engines/spark/",
        "data/spark.py",
        "spark_ml/",
        "bench/mllib.py",
        "bench/distributor.py",
    ),
}


@dataclass(frozen=True)
class Import:
    module: str  # the importing file, relative to the package: "ps/server.py"
    line: int
    target: str  # the dotted name imported: "ember.wire", "zmq.asyncio"


def part_of(relative: str) -> str:
    """The top-level part a file belongs to: "ps" for ps/server.py, "cli" for cli.py."""
    first = relative.split("/", 1)[0]
    return first.removesuffix(".py")


def imports_of(relative: str, source: str) -> list[Import]:
    """Every import in a module, lazy ones inside functions included."""
    package = ["ember", *relative.removesuffix(".py").split("/")]
    package = package[:-1]  # the package the module lives in (an __init__ is its own)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(relative, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package[: len(package) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target == "ember":  # `from ember import x`: x is a part, or the package
                found += [Import(relative, node.lineno, f"ember.{a.name}") for a in node.names]
            else:
                found.append(Import(relative, node.lineno, target))
    return found


def layer_of(part: str) -> int:
    for index, layer in enumerate(LAYERS):
        if part in layer:
            return index
    raise AssertionError(f"part {part!r} is in no layer of LAYERS; add it where it belongs")


def violations(files: dict[str, str]) -> list[str]:
    """What breaks the rules, as one line each, for files given as {relative path: source}."""
    found = []
    for relative, source in sorted(files.items()):
        part = part_of(relative)
        lines = source.count("\n") + 1
        if lines > MAX_LINES:
            found.append(f"{relative}: {lines} lines, over the ceiling of {MAX_LINES}")
        for imp in imports_of(relative, source):
            top = imp.target.split(".")[0]
            where = f"{relative}:{imp.line} imports {imp.target}"
            if top in CONFINED and not relative.startswith(CONFINED[top]):
                found.append(f"{where}, allowed only in {', '.join(CONFINED[top])}")
            if top != "ember":
                continue
            names = imp.target.split(".")
            # `from ember import fit`: a name of the package itself, not one of its parts
            target = names[1] if len(names) > 1 and names[1] in PARTS else "__init__"
            if target == part:
                continue
            if layer_of(target) >= layer_of(part):
                found.append(f"{where}: {part} may not depend on {target}")
    return found


def package_files() -> dict[str, str]:
    return {
        path.relative_to(PACKAGE).as_posix(): path.read_text(encoding="utf-8")
        for path in PACKAGE.rglob("*.py")
    }


def test_the_package_follows_its_import_directions_confinements_and_size_ceiling() -> None:
    found = violations(package_files())
    assert not found, "\n".join(found)


def test_every_part_of_the_package_has_a_layer() -> None:
    for relative in package_files():
        layer_of(part_of(relative))


@pytest.mark.parametrize(
    ("relative", "source", "expected"),
    [
        ("ps/server.py", "import zmq\n", "ps/server.py:1 imports zmq, allowed only in wire"),
        (
            "ps/server.py",
            "from ember.algorithms import SGDRule\n",
            "ps/server.py:1 imports ember.algorithms: ps may not depend on algorithms",
        ),
        (
            "wire/channel.py",
            "def f():\n    from ember.ps import PSClient\n",
            "wire/channel.py:2 imports ember.ps: wire may not depend on ps",
        ),
        (
            "engines/run.py",
            "from ember import __version__\n",
            "engines/run.py:1 imports ember.__version__: engines may not depend on __init__",
        ),
        (
            "bench/runner.py",
            "from pyspark.sql import SparkSession\n",
            "bench/runner.py:1 imports pyspark.sql, allowed only in engines/spark/, data/spark.py,"
            " spark_ml/, bench/mllib.py, bench/distributor.py",
        ),
        (
            "config.py",
            "from . import metrics\nfrom .wire import seal\n",
            "config.py:2 imports ember.wire: config may not depend on wire",
        ),
        ("metrics.py", "x = 1\n" * 401, "metrics.py: 402 lines, over the ceiling of 400"),
    ],
)
def test_a_forbidden_import_or_an_oversized_module_is_reported(
    relative: str, source: str, expected: str
) -> None:
    assert expected in violations({relative: source})


def test_allowed_imports_are_not_reported() -> None:
    files = {
        "wire/channel.py": "import zmq\nfrom ember.errors import ProtocolError\n",
        "ps/server.py": "from ember.wire import Chunk\nfrom ember.ps.clocks import ClockTable\n",
        "engines/spark/driver.py": "import pyspark\nfrom ember.worker import run_worker\n",
        "cli.py": "from ember.bench.runner import run\nfrom ember._version import __version__\n",
    }
    assert violations(files) == []
