"""A plan sizes hundreds of runs without building a model twice, remembers what
never changes (mlxfit/model/facts.py), offers only comparable models, and its
modules import downward only."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from mlxfit.estimate import remedies, sizing
from mlxfit.estimate.detailed import _count, _counted, _totals
from mlxfit.estimate.plan import make_plan
from mlxfit.machine import Machine
from mlxfit.model import facts, lazy_model
from mlxfit.model.architecture import architecture_from_config, from_model
from mlxfit.model.resolve import catalog, from_catalog
from mlxfit.model.training import TrainingConfig
from conftest import GB

def budget(total_gb: int) -> Machine:
    """A hypothetical Mac of this memory, three quarters of it the budget."""
    total = total_gb * GB
    return Machine(total, 0, total, total // 4, total - total // 4, "metal", True, hypothetical=True)


PACKAGE = Path(__file__).resolve().parent.parent / "mlxfit"


def import_graph() -> dict[str, set[str]]:
    """module -> the mlxfit modules it imports, at the top or inside a function."""
    def name_of(path: Path) -> str:
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {name_of(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[name] = {d for d in found if d in files and d != name and d != "mlxfit" and not name.startswith(d + ".")}
    return graph


def test_no_module_of_mlxfit_imports_in_a_circle():
    graph = import_graph()
    assert "mlxfit.estimate.sizing" in graph["mlxfit.estimate.remedies"]
    assert "mlxfit.estimate.plan" not in graph["mlxfit.estimate.remedies"]
    assert not graph["mlxfit.estimate.sizing"] & {"mlxfit.estimate.plan", "mlxfit.estimate.remedies"}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles


def test_remedies_and_sizing_import_on_their_own():
    for module in ("mlxfit.estimate.sizing", "mlxfit.estimate.remedies"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_another_model_stays_comparable():
    qwen7 = from_catalog("Qwen/Qwen2.5-7B-Instruct")
    family, same_type, maker = remedies.comparable_models(qwen7)
    assert family and {m.family for m in family} == {"Qwen2.5"}
    assert {m.model_type for m in same_type} == {"qwen2"}
    assert {m.maker for m in maker} == {"Qwen"}
    offered = [m.id for group in (family, same_type, maker) for m in group]
    assert not any("LFM2" in m or "gemma" in m for m in offered)
    assert all(m.params < qwen7.params for group in (family, same_type, maker) for m in group)
    assert offered.index("Qwen/Qwen2.5-3B-Instruct") < offered.index("Qwen/Qwen3-4B")  # the family first
    # The 30B MoE on 32 GB once got LiquidAI/LFM2-350M: no Qwen fits its settings, so no model is offered.
    moe = from_catalog("Qwen/Qwen3-30B-A3B")
    plan = make_plan(budget(32), moe, TrainingConfig(), backend="metal")
    offered = [o.model.id for o in plan.options] + [r.change for r in plan.remedies]
    assert not any("LFM2" in m for m in offered)


def test_remembered_facts_are_the_computed_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "facts"))
    config = catalog()["qwen/qwen3-0.6b"][1]
    key = lazy_model.config_key(config)
    first = architecture_from_config(config)  # computed, then kept
    facts._loaded.clear()  # as a new process: read back from the file
    kept = architecture_from_config(config)
    assert kept == first == from_model(lazy_model.model_for_key(key), config)
    args = ("lora", 16, 8, None, None)
    for bits in ((None, None), (4, 64)):
        _counted.cache_clear()
        computed = _counted(key, *bits, *args)
        facts._loaded.clear()
        _counted.cache_clear()
        assert _counted(key, *bits, *args) == computed == _count(key, *bits, *args)
    assert len(list((tmp_path / "facts" / "facts").iterdir())) == 1  # one file per config


def new_process():
    """Forget what this process remembers, as a new probe would start."""
    for cache in (lazy_model.model_for_key, _counted, _totals, sizing.catalog_model):
        cache.cache_clear()
    facts._loaded.clear()


def record_builds(monkeypatch) -> list:
    """The config keys of every model built from now on, in order."""
    built = []
    real = lazy_model.build
    monkeypatch.setattr(lazy_model, "build", lambda config: built.append(lazy_model.config_key(config)) or real(config))
    return built


def test_a_second_plan_builds_nothing(tmp_path, monkeypatch):
    """What a plan asked once (the catalog models it compared included) is
    remembered: the same probe again builds no model at all."""
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "facts"))
    def plan():
        return make_plan(budget(16), from_catalog("Qwen/Qwen2.5-3B-Instruct"),
                         TrainingConfig(max_seq_length=2048), backend="metal")

    built = record_builds(monkeypatch)
    monkeypatch.setattr(facts, "USE_SHIPPED", False)  # as for a model the package has no answers for
    new_process()
    first = plan()
    assert first.options  # it planned (and compared other models)
    assert built and len(built) == len(set(built))  # the first time, each model built once
    new_process()
    built.clear()
    again = plan()
    assert built == []
    assert again.to_dict() == first.to_dict()


def test_a_cache_that_cannot_be_written_only_costs_time(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(blocked))  # facts/ cannot be made under a file
    facts._loaded.clear()
    config = catalog()["qwen/qwen3-0.6b"][1]
    assert architecture_from_config(config).params == 596049920
    facts._store(tmp_path / "x.pickle", {"unpicklable": lambda: None})  # never raises
    assert not (tmp_path / "x.pickle").exists() and not list(tmp_path.glob(".facts-*"))


def skip_unless_shipped_for_these_versions(computed_under):
    """A new mlx or mlx-lm release (CI installs the newest allowed) leaves the shipped
    answers unused, which costs a first probe time, never correctness: not a failure."""
    if computed_under and not computed_under.startswith(facts.versions() + " "):
        pytest.skip(f"the shipped facts are for {' '.join(computed_under.split()[:4])}, not the installed "
                    f"{facts.versions()}: unused here (`{facts.REGENERATE}` ships them for these)")


def test_the_shipped_catalog_facts_are_current():
    """mlxfit/data/facts.pickle.xz answers the catalog's models before any run; it
    is used only under the fingerprint it was computed under, so stale data is never
    wrong, only slow: this test asks for it to be regenerated."""
    computed_under, known = facts.read_shipped()
    skip_unless_shipped_for_these_versions(computed_under)
    stale = f"mlxfit/data/facts.pickle.xz is stale: regenerate with `{facts.REGENERATE}`"
    assert computed_under == facts.fingerprint(), f"{stale} (mlx / mlx-lm or the source of {facts.SOURCES} changed)"
    keys = {facts.shipped_key(lazy_model.config_key(config)): model_id for model_id, config in catalog().values()}
    assert set(known) == set(keys), f"{stale} (the catalog changed: {sorted(set(keys) ^ set(known))[:3]})"
    config = catalog()["qwen/qwen3-0.6b"][1]
    key = lazy_model.config_key(config)
    answers = facts.shipped(key)
    assert answers["architecture"] == from_model(lazy_model.built_for_key(key), config)
    counted = [name for name in answers if name[0] == "counted"]
    assert counted
    for name in counted:  # the same as computed here
        assert answers[name] == _count(key, *name[1:])


def test_a_first_plan_of_a_catalog_model_builds_nothing(tmp_path, monkeypatch):
    """An empty cache (a user's first probe): the shipped answers stand in, and are
    then remembered as computed ones would be."""
    skip_unless_shipped_for_these_versions(facts.read_shipped()[0])
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "facts"))
    new_process()
    built = record_builds(monkeypatch)
    plan = make_plan(budget(16), from_catalog("Qwen/Qwen2.5-7B-Instruct"), TrainingConfig(max_seq_length=2048),
                     backend="metal")
    assert plan.options and built == []
    assert list((tmp_path / "facts" / "facts").iterdir())  # kept in the user's cache as well
