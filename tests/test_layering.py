"""The package's layers import only downward: no import cycles, the common layer knows no framework, and the rest
of hvdlite reaches the launcher (hvdlite.runner) only through its public module, hvdlite.runner.api.

Imports inside functions count too: a deferred import that closes a circle still couples the two modules both
ways, which is what this guards against.
"""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# source folder -> the package it installs as (setup.py's package_dir)
SOURCES = {"hvdlite": "hvdlite", "launcher": "hvdlite.runner"}


def _modules():
    """{dotted module name: path} for every module the project installs."""
    found = {}
    for folder_name, package in SOURCES.items():
        top = os.path.join(REPO, folder_name)
        for folder, _, files in os.walk(top):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = ".".join([package] + os.path.relpath(path, top)[:-3].split(os.sep))
                    found[dotted.removesuffix(".__init__")] = path
    return found


def _imports_of(module, path, modules):
    """The modules among ``modules`` that ``module`` (source file ``path``) imports, anywhere in the file."""
    is_package = path.endswith("__init__.py")
    targets = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = module.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the module pkg.sub when it is one, else a name of pkg.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        targets.update(name for name in names if name in modules and name != module)
    return targets


def _import_graph():
    modules = _modules()
    return {module: _imports_of(module, path, modules) for module, path in modules.items()}


def _cycles(graph):
    """Every elementary cycle found by a depth-first search (enough to name each offending circle)."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycles():
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_common_layer_imports_no_layer_above_it():
    """hvdlite.common is what the ranks need to join a job; the adapters, the launcher and the executors
    build on it, never the other way round."""
    above = ("hvdlite.torch", "hvdlite.tensorflow", "hvdlite.runner", "hvdlite.ray", "hvdlite.spark")
    offenders = {
        module: sorted(t for t in targets if t.startswith(above))
        for module, targets in _import_graph().items()
        if module.startswith("hvdlite.common")
    }
    assert not {m: t for m, t in offenders.items() if t}


#: The launcher's public module: the only part of hvdlite.runner that the rest of hvdlite may import.
RUNNER_PUBLIC_MODULE = "hvdlite.runner.api"


def _in_runner(module: str) -> bool:
    return module == "hvdlite.runner" or module.startswith("hvdlite.runner.")


def test_the_library_uses_the_launcher_only_through_its_public_module():
    """hvdlite.run, hvdlite.spark and hvdlite.ray share code with the launcher through hvdlite.runner.api alone, so
    the rest of hvdlite.runner can change without them; hvdlite.common, which the launcher builds on, imports
    nothing of it at all."""
    graph = _import_graph()
    assert RUNNER_PUBLIC_MODULE in graph
    outside = {
        module: sorted(t for t in targets if _in_runner(t) and t != RUNNER_PUBLIC_MODULE)
        for module, targets in graph.items()
        if not _in_runner(module)
    }
    assert not {m: t for m, t in outside.items() if t}, (
        "modules outside hvdlite.runner importing more of it than %s" % RUNNER_PUBLIC_MODULE
    )
    common = {
        module: sorted(t for t in targets if _in_runner(t))
        for module, targets in graph.items()
        if module.split(".")[:2] == ["hvdlite", "common"]
    }
    assert not {m: t for m, t in common.items() if t}, "hvdlite.common importing the launcher"


def test_the_layering_checks_see_imports_of_the_launcher(tmp_path):
    """The graph catches each way of reaching into hvdlite.runner: absolute, from-package and deferred imports."""
    sources = {
        "hvdlite/x.py": "def f():\n    from hvdlite.runner.local import main\n",
        "hvdlite/y.py": "from hvdlite.runner import processes\n",
        "hvdlite/z.py": "import hvdlite.runner.api\nfrom hvdlite.runner.api import run\n",
    }
    modules = {"hvdlite.runner.local", "hvdlite.runner.processes", "hvdlite.runner.api", "hvdlite.runner"}
    found = {}
    for relative, text in sources.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        module = relative[:-3].replace("/", ".")
        found[module] = _imports_of(module, str(path), modules | {"hvdlite.x", "hvdlite.y", "hvdlite.z"})
    assert found == {
        "hvdlite.x": {"hvdlite.runner.local"},
        "hvdlite.y": {"hvdlite.runner.processes"},
        "hvdlite.z": {"hvdlite.runner.api"},
    }


def test_launcher_sources_install_as_hvdlite_runner():
    modules = _modules()
    assert "hvdlite.runner.launch" in modules and modules["hvdlite.runner.launch"].endswith("launcher/launch.py")
    import hvdlite.runner.launch

    assert os.path.samefile(hvdlite.runner.launch.__file__, modules["hvdlite.runner.launch"])


# The core's folders, lowest first: each may include only the folders before it (gpu sits beside transport and
# collectives: both need only common).
CORE_LAYERS = [
    ("common",),
    ("transport", "gpu"),
    ("collectives",),
    ("choice",),
    ("tuning",),
    ("backends",),
    ("runtime",),
]


def test_core_folders_include_only_the_folders_below_them():
    import re

    src = os.path.join(REPO, "hvdlite_core", "src")
    level = {folder: i for i, group in enumerate(CORE_LAYERS) for folder in group}
    assert sorted(level) == sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))), (
        "a core folder is missing from CORE_LAYERS"
    )
    upward = []
    for folder in level:
        for root, _, files in os.walk(os.path.join(src, folder)):
            for name in files:
                with open(os.path.join(root, name)) as f:
                    for included in re.findall(r'#include "([a-z_]+)/', f.read()):
                        if included in level and included != folder and level[included] >= level[folder]:
                            upward.append(f"{folder}/{name} includes {included}/")
    assert not upward, "includes against the core's layering:\n" + "\n".join(upward)
