"""The tree is the architecture: imports run one way between the parts (folders of runner/), with
no cycle, and the step loop imports without llama_cpp. Every import counts, the ones inside
functions and in `if TYPE_CHECKING:` blocks too (an annotation is a dependency as well)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "runner"

# part -> the parts it may import (docs/architecture.md, "Module map", says the same); a part is a
# folder of runner/, the package itself is "root" and `python -m runner` belongs to the CLI
ALLOWED = {
    "core": set(),
    "sampling": {"core"},
    "prompt": {"core"},
    "config": {"core", "sampling"},
    "runtime": {"core", "config"},
    "scheduler": {"core", "config", "sampling"},
    "speculation": {"core", "config", "sampling", "scheduler", "runtime"},
    "catalog": {"core", "runtime"},
    "model": {"core", "config", "sampling", "prompt", "runtime", "scheduler", "speculation", "catalog"},
    "python_api": {"core", "config", "sampling", "prompt", "scheduler", "model", "catalog"},
    "server": {"core", "config", "sampling", "prompt", "runtime", "scheduler", "speculation", "catalog", "model",
               "root"},
    "router": {"core", "config", "runtime", "catalog", "server"},
    "cli": {"core", "config", "sampling", "prompt", "runtime", "scheduler", "speculation", "catalog", "model",
            "python_api", "server", "router", "root"},
    "root": {"python_api"},
}


def part_of(module: str) -> str:
    if module == "runner.__main__":
        return "cli"
    return module.split(".")[1] if "." in module else "root"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The runner modules this file imports, anywhere in it."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "runner")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("runner"):
            for alias in node.names:  # `from runner.x import y` may name a module y
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {name: imports_of(path, modules) - {name} for name, path in files.items()}


def test_every_module_belongs_to_a_known_part() -> None:
    unknown = {m for m in import_graph() if part_of(m) not in ALLOWED}
    assert not unknown


def test_imports_between_parts_run_one_way() -> None:
    forbidden = sorted(f"{m} -> {dep}" for m, deps in import_graph().items() for dep in deps
                       if part_of(dep) != part_of(m) and part_of(dep) not in ALLOWED[part_of(m)])
    assert forbidden == []


def test_no_import_cycle() -> None:
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                walk(dep, path + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    assert cycles == []


def test_the_step_loop_and_the_cost_model_import_without_llama_cpp() -> None:
    code = ("import sys; import runner.scheduler.engine, runner.speculation.speculator, runner.server.openai_params; "
            "print('llama_cpp' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_only_the_runtime_wrappers_import_llama_cpp() -> None:
    importers = sorted(module_name(p) for p in PACKAGE.rglob("*.py")
                       if any(isinstance(n, (ast.Import, ast.ImportFrom)) and "llama_cpp" in ast.dump(n)
                              for n in ast.walk(ast.parse(p.read_text()))))
    # (mtmd: libmtmd, for projectors; rpc: ggml-rpc, for workers on other machines; staging: llama.cpp's
    # staging calls, found by name, for MTP and EAGLE3 drafting)
    assert importers == ["runner.runtime.llama", "runner.runtime.mtmd", "runner.runtime.rpc", "runner.runtime.staging"]
