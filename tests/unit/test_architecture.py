"""The package's shape, read from its source with `ast`: import directions, where zmq and
pyspark may be imported, and a ceiling on module size."""

from __future__ import annotations

import ast
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
MAX_LINES = 400
# What each part may import of ember is declared where the part lives: a line of its docstring
# (a folder's __init__.py, a top-level module's own), "imports: config, errors" or
# "imports: nothing of ember", with free text after a ";"; a long list goes on in lines
# indented by two spaces. The layers of docs/architecture.md
# are read from those lines, never from a list kept here.
# Lines of Python under each folder, the lab's benchmarks included. A ratchet: the count may
# fall, and the number follows it down (it may stand at most SLACK above the count); it rises
# only in a commit that raises the number here.
LINE_BUDGET = {"src/ember": 24600, "lab": 10140}
SLACK = 0.02
SPARK_PARTS = ("engines/spark/", "data/spark.py", "spark_ml/")
DECLARATION = re.compile(r"^imports: (?P<names>[^;\n]*(?:\n  [^;\n]*)*)", re.MULTILINE)


@dataclass(frozen=True)
class Package:
    name: str  # the top-level import name: "ember"
    folder: Path  # where its files are
    confined: dict[str, tuple[str, ...]]  # a package only some files may import -> those files
    forbidden: dict[str, str]  # a package none may import -> why


EMBER = Package(
    "ember",
    REPOSITORY / "src" / "ember",
    {"zmq": ("wire",), "mlflow": ("metrics/tracking.py",), "pyspark": SPARK_PARTS},
    {"ember_lab": "ember never imports its lab; the lab imports ember"},
)
LAB = Package(
    "ember_lab",
    REPOSITORY / "lab" / "ember_lab",
    {"pyspark": ("bench/mllib.py", "bench/distributor.py"), "zmq": ()},
    {},
)


@dataclass(frozen=True)
class Import:
    module: str  # the importing file, relative to the package: "ps/server.py"
    line: int
    target: str  # the dotted name imported: "ember.wire", "zmq.asyncio"


def part_of(relative: str) -> str:
    """The top-level part a file belongs to: "ps" for ps/server.py, "cli" for cli.py."""
    first = relative.split("/", 1)[0]
    return first.removesuffix(".py")


def imports_of(relative: str, source: str, root: str = "ember") -> list[Import]:
    """Every import in a module of the package `root`, lazy ones inside functions included."""
    package = [root, *relative.removesuffix(".py").split("/")]
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
            if target in ("ember", root):  # `from ember import x`: x is a part, or the package
                found += [Import(relative, node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append(Import(relative, node.lineno, target))
    return found


def speaker_of(relative: str) -> str | None:
    """The part a file declares the imports of: its folder's __init__.py or a top-level module."""
    if "/" not in relative:
        return relative.removesuffix(".py")
    folder, _, rest = relative.partition("/")
    return folder if rest == "__init__.py" else None


def declarations(files: dict[str, str]) -> dict[str, frozenset[str] | None]:
    """Each part's declared imports (None where its docstring has no "imports:" line)."""
    declared: dict[str, frozenset[str] | None] = {}
    for relative, source in files.items():
        part = speaker_of(relative)
        if part is None:
            continue
        match = DECLARATION.search(ast.get_docstring(ast.parse(source)) or "")
        if match is None:
            declared[part] = None
            continue
        names = match.group("names").strip()
        listed = [] if names.startswith("nothing") else names.split(",")
        declared[part] = frozenset(name.strip() for name in listed)
    return declared


def cycle_in(graph: dict[str, frozenset[str]]) -> list[str]:
    """One cycle of the graph as the path round it ([] when there is none), found depth first."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every way out is walked
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for onward in sorted(graph.get(node, ())):
            if state.get(onward) == "open":
                return [*path[path.index(onward) :], onward]
            if onward not in state and (found := visit(onward)):
                return found
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def layers(declared: dict[str, frozenset[str]]) -> list[list[str]]:
    """The parts by layer, lowest first: a part sits one above the highest part it may import."""
    depth: dict[str, int] = {}

    def depth_of(part: str) -> int:
        if part not in depth:
            depth[part] = 1 + max((depth_of(d) for d in declared.get(part, ())), default=-1)
        return depth[part]

    for part in declared:
        depth_of(part)
    return [
        sorted(p for p, d in depth.items() if d == level)
        for level in range(max(depth.values()) + 1)
    ]


def part_imported(target: str, parts: Collection[str]) -> str:
    """The part a dotted import of the package names: "wire" for ember.wire.curve, and
    "__init__" for `from ember import fit`, a name of the package itself."""
    names = target.split(".")
    return names[1] if len(names) > 1 and names[1] in parts else "__init__"


def violations(
    files: dict[str, str],
    declared: dict[str, frozenset[str] | None] | None = None,
    package: Package = EMBER,
) -> list[str]:
    """What breaks the rules, as one line each, for a package's files given as {relative path:
    source}; the parts' declared imports are read from those files unless given."""
    declared = declarations(files) if declared is None else declared
    found = []
    for part, names in sorted(declared.items()):
        if names is None:
            found.append(f"{part}: no 'imports:' line in its docstring naming what it may import")
        for name in sorted(names or ()):
            if name not in declared:
                found.append(f"{part}: declares {name!r}, which is not a part of the package")
    if cycle := cycle_in({part: names or frozenset() for part, names in declared.items()}):
        found.append(f"the declared imports go round a cycle: {' -> '.join(cycle)}")
    for relative, source in sorted(files.items()):
        part = part_of(relative)
        lines = source.count("\n") + 1
        if lines > MAX_LINES:
            found.append(f"{relative}: {lines} lines, over the ceiling of {MAX_LINES}")
        for imp in imports_of(relative, source, package.name):
            top = imp.target.split(".")[0]
            where = f"{relative}:{imp.line} imports {imp.target}"
            allowed_in = package.confined.get(top)
            if allowed_in is not None and not relative.startswith(allowed_in):
                found.append(f"{where}, allowed only in {', '.join(allowed_in) or 'ember'}")
            if top in package.forbidden:
                found.append(f"{where}: {package.forbidden[top]}")
            if top != package.name:
                continue
            target = part_imported(imp.target, declared)
            allowed = declared.get(part) or frozenset()
            if target != part and target not in allowed:
                may = ", ".join(sorted(allowed)) or "nothing"
                found.append(f"{where}: {part} may not depend on {target} (it declares: {may})")
    return found


def unused_declarations(files: dict[str, str], root: str = "ember") -> list[str]:
    """Declared imports no file of the part makes: a map that says more than the code does."""
    used: dict[str, set[str]] = {}
    declared = declarations(files)
    for relative, source in files.items():
        for imp in imports_of(relative, source, root):
            if imp.target.split(".")[0] == root:
                target = part_imported(imp.target, declared)
                used.setdefault(part_of(relative), set()).add(target)
    return [
        f"{part}: declares {name} but imports nothing of it"
        for part, names in sorted(declared.items())
        for name in sorted((names or frozenset()) - used.get(part, set()))
    ]


def private_names(relative: str, source: str) -> list[str]:
    """The lab's imports of an underscore name of ember (a module or a name in one): the lab
    uses what ember exports on purpose, as a user would."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            dotted = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in dotted:
            parts = name.split(".")
            private = [p for p in parts[1:] if p.startswith("_") and not p.startswith("__")]
            if parts[0] == "ember" and private:
                found.append(f"{relative}:{node.lineno} imports {name}, a private name of ember")
    return found


# What the lab may import of ember: the public face, and ember.probe, the surface ember offers
# its lab on purpose.
LAB_SURFACE = frozenset(
    {"ember", "ember.config", "ember.errors", "ember.metrics", "ember.metrics.records"}
    | {"ember.spark_ml", "ember.probe"}
)


def past_the_surface(relative: str, source: str) -> list[str]:
    """The lab's imports of an ember module outside LAB_SURFACE."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            if module.split(".")[0] == "ember" and module not in LAB_SURFACE:
                found.append(
                    f"{relative}:{node.lineno} imports {module}: the lab imports ember through"
                    " its public face and ember.probe (add the name there)"
                )
        if isinstance(node, ast.ImportFrom) and node.module == "ember.probe":
            import ember.probe

            found += [
                f"{relative}:{node.lineno} imports {alias.name}, which ember.probe does not offer"
                for alias in node.names
                if alias.name not in ember.probe.__all__
            ]
    return found


def module_graph(files: dict[str, str], root: str) -> dict[str, frozenset[str]]:
    """Each module of the package (dotted) and the package's modules it imports, anywhere in it:
    `from ember.wire import curve` is an import of ember.wire.curve, `from ember.wire import
    Chunk` one of ember.wire (its __init__)."""
    names = {
        ".".join([root, *relative.removesuffix(".py").split("/")]).removesuffix(".__init__")
        for relative in files
    }
    graph = {}
    for relative, source in files.items():
        module = ".".join([root, *relative.removesuffix(".py").split("/")])
        package = module.split(".")[:-1] if not module.endswith("__init__") else module.split(".")
        module = module.removesuffix(".__init__")
        targets = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                dotted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                dotted = [f"{target}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in dotted:
                while name and name not in names:  # a name in a module: the module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = frozenset(targets)
    return graph


def package_files(package: Package = EMBER) -> dict[str, str]:
    return {
        path.relative_to(package.folder).as_posix(): path.read_text(encoding="utf-8")
        for path in package.folder.rglob("*.py")
    }


def test_the_package_follows_its_declared_imports_confinements_and_size_ceiling() -> None:
    found = violations(package_files())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("package", [EMBER, LAB], ids=lambda package: package.name)
def test_no_module_imports_itself_round_a_cycle(package: Package) -> None:
    """Lazy imports and those only for type checking count too: a cycle is two modules that
    each need the other, whenever the import runs."""
    cycle = cycle_in(module_graph(package_files(package), package.name))
    assert not cycle, f"an import cycle: {' -> '.join(cycle)}"


def test_an_import_cycle_is_found_through_a_lazy_or_type_checking_import() -> None:
    files = {
        "ps/__init__.py": "",
        "ps/coded.py": "if TYPE_CHECKING:\n    from ember.ps.pushpull import Held\n",
        "ps/pushpull.py": "def f():\n    from ember.ps import coded\n",
        "ps/fold.py": "from ember.ps import coded, pushpull\n",
    }
    assert cycle_in(module_graph(files, "ember")) == [
        "ember.ps.coded",
        "ember.ps.pushpull",
        "ember.ps.coded",
    ]


@pytest.mark.parametrize("folder", sorted(LINE_BUDGET))
def test_the_code_keeps_within_its_line_budget(folder: str) -> None:
    lines = sum(
        path.read_text(encoding="utf-8").count("\n") for path in (REPOSITORY / folder).rglob("*.py")
    )
    budget = LINE_BUDGET[folder]
    assert lines <= budget, (
        f"{folder} has {lines} lines of Python, over its budget of {budget}: make room, or raise"
        " LINE_BUDGET in the same commit and say why in its message"
    )
    assert budget <= lines * (1 + SLACK), (
        f"{folder} has {lines} lines of Python, {budget - lines} under its budget of {budget}:"
        f" lower LINE_BUDGET to {lines}, so that the room is not spent again unnoticed"
    )


def test_every_declared_import_is_one_the_part_makes() -> None:
    found = unused_declarations(package_files())
    assert not found, "\n".join(found)


def test_the_lab_follows_its_declared_imports_and_imports_no_private_name_of_ember() -> None:
    files = package_files(LAB)
    found = violations(files, package=LAB) + unused_declarations(files, LAB.name)
    found += [
        line for relative, source in files.items() for line in private_names(relative, source)
    ]
    benchmarks = {
        f"benchmarks/{path.name}": path.read_text(encoding="utf-8")
        for path in (LAB.folder.parent / "benchmarks").glob("*.py")
    }
    found += [
        line
        for relative, source in {**files, **benchmarks}.items()
        for line in past_the_surface(relative, source)
    ]
    assert not found, "\n".join(found)


def test_the_probe_offers_each_of_its_names_from_the_module_it_names() -> None:
    import ember.probe

    where = ember.probe._WHERE
    assert ember.probe.__all__ == sorted(where)
    for name in ember.probe.__all__:
        assert getattr(ember.probe, name) is not None, name
    with pytest.raises(AttributeError, match="has no attribute 'ShardState'"):
        ember.probe.ShardState  # noqa: B018


DECLARED = {
    "errors": frozenset(),
    "config": frozenset({"errors"}),
    "wire": frozenset({"errors"}),
    "ps": frozenset({"config", "errors", "wire"}),
    "algorithms": frozenset({"config", "errors", "ps"}),
    "engines": frozenset({"algorithms", "ps", "wire"}),
    "cli": frozenset({"engines"}),
    "__init__": frozenset({"config"}),
    "metrics": frozenset(),
}


@pytest.mark.parametrize(
    ("relative", "source", "expected"),
    [
        ("ps/server.py", "import zmq\n", "ps/server.py:1 imports zmq, allowed only in wire"),
        (
            "ps/server.py",
            "from ember.algorithms import SGDRule\n",
            "ps/server.py:1 imports ember.algorithms: ps may not depend on algorithms"
            " (it declares: config, errors, wire)",
        ),
        (
            "wire/channel.py",
            "def f():\n    from ember.ps import PSClient\n",
            "wire/channel.py:2 imports ember.ps: wire may not depend on ps (it declares: errors)",
        ),
        (
            "engines/run.py",
            "from ember import __version__\n",
            "engines/run.py:1 imports ember.__version__: engines may not depend on __init__"
            " (it declares: algorithms, ps, wire)",
        ),
        (
            "engines/run.py",
            "from pyspark.sql import SparkSession\n",
            "engines/run.py:1 imports pyspark.sql, allowed only in engines/spark/, data/spark.py,"
            " spark_ml/",
        ),
        (
            "cli.py",
            "def f():\n    from ember_lab.bench.commands import bench\n",
            "cli.py:2 imports ember_lab.bench.commands: ember never imports its lab; the lab"
            " imports ember",
        ),
        (
            "config/run.py",
            "from . import strategies\nfrom ember.wire import seal\n",
            "config/run.py:2 imports ember.wire: config may not depend on wire"
            " (it declares: errors)",
        ),
        ("metrics.py", "x = 1\n" * 401, "metrics.py: 402 lines, over the ceiling of 400"),
    ],
)
def test_a_forbidden_import_or_an_oversized_module_is_reported(
    relative: str, source: str, expected: str
) -> None:
    assert expected in violations({relative: source}, DECLARED)


def test_allowed_imports_are_not_reported() -> None:
    files = {
        "wire/channel.py": "import zmq\nfrom ember.errors import ProtocolError\n",
        "ps/server.py": "from ember.wire import Chunk\nfrom ember.ps.clocks import ClockTable\n",
        "engines/spark/driver.py": "import pyspark\nfrom ember.ps import PSClient\n",
        "cli.py": "from ember.engines import ParsedRun\n",
    }
    assert violations(files, DECLARED) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"wire/__init__.py": '"""The wire."""\n'},
            "wire: no 'imports:' line in its docstring naming what it may import",
        ),
        (
            {"wire/__init__.py": '"""The wire.\n\nimports: errors, sockets\n"""\n'},
            "wire: declares 'sockets', which is not a part of the package",
        ),
        (
            {
                "errors.py": '"""Errors.\n\nimports: nothing of ember\n"""\n',
                "wire/__init__.py": '"""The wire.\n\nimports: errors, ps\n"""\n',
                "ps/__init__.py": '"""The server.\n\nimports: wire; and back\n"""\n',
            },
            "the declared imports go round a cycle: ps -> wire -> ps",
        ),
    ],
)
def test_a_missing_unknown_or_cyclic_declaration_is_reported(
    files: dict[str, str], expected: str
) -> None:
    assert expected in violations(files)


def test_a_declared_import_the_part_never_makes_is_reported() -> None:
    files = {
        "errors.py": '"""Errors.\n\nimports: nothing of ember\n"""\n',
        "wire/__init__.py": '"""The wire.\n\nimports: errors\n"""\n',
    }
    assert unused_declarations(files) == ["wire: declares errors but imports nothing of it"]


def test_layers_put_each_part_above_what_it_imports() -> None:
    assert layers(DECLARED) == [
        ["errors", "metrics"],
        ["config", "wire"],
        ["__init__", "ps"],
        ["algorithms"],
        ["engines"],
        ["cli"],
    ]


def test_the_labs_imports_past_its_surface_are_reported() -> None:
    source = (
        "from ember.ps import PSClient\nimport ember.wire\n"
        "from ember.probe import PSClient, ShardState\n"
    )
    found = past_the_surface("bench/runner.py", source)
    assert [line.split(": ")[0].split(",")[0] for line in found] == [
        "bench/runner.py:1 imports ember.ps",
        "bench/runner.py:2 imports ember.wire",
        "bench/runner.py:3 imports ShardState",
    ]


def test_the_labs_imports_of_private_names_of_ember_are_reported() -> None:
    source = "from ember.data.spill import _spill\nfrom ember import __version__, _version\n"
    assert private_names("bench/runner.py", source) == [
        "bench/runner.py:1 imports ember.data.spill._spill, a private name of ember",
        "bench/runner.py:2 imports ember._version, a private name of ember",
    ]


if __name__ == "__main__":  # the layers, lowest first, as docs/architecture.md draws them
    for package in (EMBER, LAB):
        declared = declarations(package_files(package))
        for level, parts in enumerate(layers({p: n or frozenset() for p, n in declared.items()})):
            print(package.name, level, " ".join(parts))
