"""Imports run downward: servicer -> preparation -> engine -> loaders -> common.

Every module under backend/ and common/ is read with `ast` (nothing is
imported or run); its imports, at the top and inside functions alike, are
resolved the way the process resolves them (backend/ and the repository root
on sys.path, so `import prepare`, `from engine.x import y`, `from loaders
import z`, `from common.x import y`; common/ also imports its own modules flat,
as LocalAI's backends load it). The generated gRPC stubs are the wire
contract, usable from any layer.
"""

import ast
import os
from typing import Dict, List, Optional, Set


def _repo() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    while not (os.path.isdir(os.path.join(here, "backend")) and os.path.isdir(os.path.join(here, "common"))):
        parent = os.path.dirname(here)
        assert parent != here, "no repository root with backend/ and common/ above this test"
        here = parent
    return here


REPO = _repo()
CONTRACT = {"backend_pb2", "backend_pb2_grpc"}  # generated from backend.proto

# Layers by module name (a package's own name covers its __init__ and everything under it).
SERVICER = {"backend", "servicer", "replies", "audio_replies", "status_map", "rpc_gate", "localai_backend", "demo", "test"}  # the servicer and the scripts that run it
PREPARE = {"prepare"}
ENGINE = {"engine"}
LOADERS = {"loaders", "load_options", "limits", "store"}  # load-time options, budgets and the store sit with the loaders


# ---- the graph ----------------------------------------------------------------


def _modules() -> Dict[str, str]:
    """Module name -> file, for every .py under backend/ (named from backend/) and common/."""
    found = {}
    for root, prefix in ((os.path.join(REPO, "backend"), ""), (os.path.join(REPO, "common"), "common.")):
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            rel = os.path.relpath(folder, root)
            package = prefix + ("" if rel == "." else rel.replace(os.sep, ".") + ".")
            for name in files:
                if name.endswith(".py"):
                    stem = name[:-3]
                    module = package[:-1] if stem == "__init__" else package + stem
                    found[module or prefix[:-1]] = os.path.join(folder, name)
    return found


MODULES = _modules()


def _package(module: str) -> str:
    """The package a module's relative imports start from."""
    if MODULES[module].endswith("__init__.py"):
        return module
    return module.rpartition(".")[0]


def _deepest(name: str) -> Optional[str]:
    """`import a.b.c` loads a, a.b and a.b.c: the deepest of them that is ours."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(base: str, names: Optional[List[str]]) -> Set[str]:
    """What `import base` (names None) or `from base import names` reaches among our modules."""
    if names is None:
        found = _deepest(base)
        return {found} if found else set()
    # Each name is a submodule of `base`, or something `base` itself defines.
    subs = {f"{base}.{n}" for n in names}
    return {sub if sub in MODULES else base for sub in subs if sub in MODULES or base in MODULES}


def _targets(module: str, node: ast.AST) -> Set[str]:
    """The project modules one import statement reaches (third-party ones are left out)."""
    package = _package(module)
    if isinstance(node, ast.Import):
        bases = [(alias.name, None) for alias in node.names]
    elif node.level:
        parts = package.split(".") if package else []
        parts = parts[:len(parts) - (node.level - 1)]
        bases = [(".".join(parts + ([node.module] if node.module else [])), [a.name for a in node.names])]
    else:
        bases = [(node.module or "", [a.name for a in node.names])]
    found = set()
    for base, names in bases:
        reached = _imported(base, names)
        flat = f"{package}.{base}"
        if not reached and package and not getattr(node, "level", 0) and f"{package}.{base.split('.')[0]}" in MODULES:
            reached = _imported(flat, names)  # common/ imported flat, as LocalAI's backends do
        found |= reached
    return found - {module}


def _graph() -> Dict[str, Set[str]]:
    graph = {}
    for module, path in MODULES.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
        graph[module] = {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                         for t in _targets(module, node)}
    return graph


GRAPH = _graph()


def _layer(module: str) -> Optional[str]:
    top = module.split(".")[0]
    if top == "common":
        return "common"
    if module in CONTRACT:
        return "contract"
    for name, members in (("servicer", SERVICER), ("prepare", PREPARE), ("engine", ENGINE), ("loaders", LOADERS)):
        if top in members:
            return name
    return None


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def crossings(importer_layer: str, forbidden: Set[str]) -> List[str]:
    """"importer -> imported" for every import from `importer_layer` into a forbidden layer."""
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if _layer(m) == importer_layer
                  for t in targets if _layer(t) in forbidden)


# ---- the rules ----------------------------------------------------------------


def test_the_graph_sees_the_imports_it_must():
    # The resolver itself: each form of import the code uses, found (else every rule passes vacuously).
    assert "loaders.loaded" in GRAPH["loaders.cross_encoder"]  # function-level `from loaders.loaded import`
    assert "loaders.adapters" in GRAPH["loaders.model_loader"]  # `from loaders import adapters`
    assert "load_options" in GRAPH["loaders.loaded"]  # `import load_options`
    assert "common.stop_matcher" in GRAPH["common.output_router"]  # `from .stop_matcher import` / flat
    assert "engine.core" in GRAPH["engine"]  # a package's __init__
    assert {"engine", "engine.lockstep"} <= GRAPH["backend"]  # `from engine import Engine, lockstep`
    assert "engine" not in GRAPH["engine.kv_budget"]  # `import mlx.core` is not engine/mlx
    assert not any(t.split(".")[0] in ("mlx", "grpc") for targets in GRAPH.values() for t in targets)


def test_every_module_has_a_layer():
    # A new top-level module says where it sits (add it to a layer above) before the rules can hold.
    assert sorted(m for m in GRAPH if _layer(m) is None) == []


def test_the_loaders_import_no_circle():
    loaders = {m: {t for t in ts if _layer(t) == "loaders"} for m, ts in GRAPH.items() if _layer(m) == "loaders"}
    assert cycles(loaders) == []


def test_common_imports_nothing_from_the_backend():
    # common/ is a drop-in for LocalAI's other backends: it cannot lean on this one.
    assert crossings("common", {"servicer", "prepare", "engine", "loaders"}) == []


def test_the_loaders_import_neither_the_engine_nor_preparation_nor_the_servicer():
    assert crossings("loaders", {"servicer", "prepare", "engine"}) == []


def test_the_engine_imports_neither_preparation_nor_the_servicer():
    assert crossings("engine", {"servicer", "prepare"}) == []


def test_preparation_never_imports_the_servicer():
    assert crossings("prepare", {"servicer"}) == []


def test_cycles_finds_a_circle_and_only_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# ---- inside the engine ----------------------------------------------------------

# The engine's parts and what each may import of the others: the scheduler (the modules at the
# engine's top) picks and drives the rest; lockstep wraps the scheduler.
ENGINE_PARTS = {
    "kv": {"kv"},
    "prefix": {"prefix", "kv"},
    "lanes": {"lanes", "prefix", "kv"},
    "forward": {"forward", "prefix", "kv"},
    "speculation": {"speculation", "lanes", "prefix", "kv"},
    "audio": {"audio"},
    "scheduler": {"scheduler", "speculation", "lanes", "forward", "prefix", "kv", "audio"},
    "lockstep": {"lockstep", "scheduler", "speculation", "lanes", "forward", "prefix", "kv", "audio"},
}


def _part(module: str) -> Optional[str]:
    parts = module.split(".")
    if parts[0] != "engine":
        return None
    if len(parts) > 1 and parts[1] in ENGINE_PARTS and MODULES.get(f"engine.{parts[1]}", "").endswith("__init__.py"):
        return parts[1]
    return "scheduler"


def engine_crossings(graph: Dict[str, Set[str]]) -> List[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if _part(m)
                  for t in targets if _part(t) and _part(t) not in ENGINE_PARTS[_part(m)])


def test_every_engine_part_is_a_package():
    # A sub-package of the engine is named in ENGINE_PARTS before its imports can be judged.
    packages = {m.split(".")[1] for m, path in MODULES.items()
                if m.startswith("engine.") and m.count(".") == 1 and path.endswith("__init__.py")}
    assert packages == set(ENGINE_PARTS) - {"scheduler"}


def test_the_engine_parts_import_only_downward():
    assert engine_crossings(GRAPH) == []


def test_engine_crossings_sees_a_wrong_way_import():
    graph = {"engine.prefix.snapshots": {"engine.lanes.text_batch", "engine.kv.rewind"},
             "engine.lanes.text_batch": {"engine.prefix.prompt_store"},
             "engine.kv.rewind": {"engine.core"}}
    assert engine_crossings(graph) == ["engine.kv.rewind -> engine.core",
                                       "engine.prefix.snapshots -> engine.lanes.text_batch"]
