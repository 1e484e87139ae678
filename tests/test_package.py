import ast
import subprocess
import sys

HEAVY = ("torch", "onnxruntime", "fastapi", "uvicorn", "numpy", "httpx", "prometheus_client")


def test_import_tierlink_is_cheap_and_side_effect_free():
    code = ("import sys; before = set(sys.modules); import tierlink, tierlink.core, "
            "tierlink.policy, tierlink.estimate; "
            "print(','.join(sorted(m for m in set(sys.modules) - before "
            f"if m.split('.')[0] in {HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _package_imports() -> dict[str, set[str]]:
    """Package -> the other tierlink packages it imports (at module level or inside a
    function: a lazy import is still a dependency)."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "tierlink"
    edges: dict[str, set[str]] = {}
    for path in src.rglob("*.py"):
        rel = path.relative_to(src)
        pkg = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                    and node.level == 0 else [])
            for m in mods:
                parts = m.split(".")
                if parts[0] == "tierlink" and len(parts) > 1 and parts[1] != pkg:
                    edges.setdefault(pkg, set()).add(parts[1])
    return edges


def test_no_import_cycle_between_packages():
    edges = _package_imports()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            here = todo.pop()
            if here == goal:
                return True
            if here not in seen:
                seen.add(here)
                todo.extend(edges.get(here, ()))
        return False

    loops = sorted(f"{a} -> {b} -> ... -> {a}" for a, outs in edges.items() for b in outs
                   if reaches(b, a))
    assert loops == []
    assert "fleet" in edges["cli"] and "settings" in edges["node"]  # the graph is real


def test_no_class_over_400_lines():
    """Every part has a room of its own: a class that outgrows 400 lines is split."""
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "tierlink"
    big = sorted(f"{path.relative_to(src)}: {node.name} ({node.end_lineno - node.lineno + 1})"
                 for path in src.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ClassDef) and node.end_lineno
                 and node.end_lineno - node.lineno + 1 > 400)
    assert big == []


def test_only_the_cli_and_the_demo_import_the_zoo():
    """The zoo is one model source among others: every other package reaches a model
    through the framework's model layer (tierlink.models: cards, the catalog, runtimes)."""
    edges = _package_imports()
    assert sorted(p for p, outs in edges.items() if "zoo" in outs) == ["cli", "demo"]
    assert sorted(p for p, outs in edges.items() if "demo" in outs) == ["cli"]


def test_the_model_layer_stands_below_every_tool():
    """tierlink.models imports nothing of the package but the pure core, the error tree and
    durable writes; and no torch (numpy and ONNX Runtime only)."""
    assert _package_imports().get("models", set()) <= {"core", "errors", "durable"}
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "tierlink" / "models"
    modules = sorted(f"tierlink.models.{p.stem}" for p in src.glob("*.py")
                     if p.stem != "__init__")
    code = (f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_runtime_is_loaded_only_when_its_format_is_asked_for():
    """Listing the formats and loading the ONNX runtime import neither the language-model
    runtime nor torch: a node serving ONNX models pays for nothing else."""
    code = ("import sys; from tierlink.models import runtimes; "
            "names = runtimes.registry().names(); runtimes.registry().get('onnx'); "
            "print(names, 'torch' in sys.modules, 'tierlink.llm.runtime' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, torch_loaded, llm_loaded = out.stdout.strip().rsplit(" ", 2)
    # (the example runtime package setup installs, examples/runtime/, adds its 'pt2')
    assert set(ast.literal_eval(names)) >= {"llm", "multi-exit", "onnx", "python"}
    assert (torch_loaded, llm_loaded) == ("False", "False")
