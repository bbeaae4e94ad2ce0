"""Import only downward: every ``deepgen_rl`` import edge (parsed with ``ast``, including imports inside functions)
must be allowed by the layer table at the top of docs/architecture.md, which this test reads, so the map and the
code cannot drift apart."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "deepgen_rl"
DOC = ROOT / "docs" / "architecture.md"


def layer_table() -> dict[str, int]:
    """Module prefix -> layer number, from the rows ``| N | `a`, `b.c` | ... |`` of the "Layers" section."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    table: dict[str, int] = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if m:
            for name in re.findall(r"`([\w.]+)`", m.group(2)):
                table[name] = int(m.group(1))
    return table


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, mod: str | None = None) -> set[str]:
    """Absolute names of the deepgen_rl modules ``path`` (module ``mod``) imports (``from a import b`` counts as
    ``a.b`` when that is a module, else ``a``)."""
    mod = mod or module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = []
            for alias in node.names:  # "from pkg import module" imports that module
                sub = f"{target}.{alias.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").is_file() or \
                    (ROOT / Path(*sub.split("."))).is_dir()
                names.append(sub if is_module else target)
        else:
            continue
        out.update(n for n in names if n == "deepgen_rl" or n.startswith("deepgen_rl."))
    return out


def locate(name: str, table: dict[str, int]) -> tuple[str, int]:
    """The longest table prefix of a module name ``deepgen_rl.x.y`` and its layer."""
    rel = name.split(".", 1)[1] if "." in name else "deepgen_rl"
    parts = rel.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in table:
            return key, table[key]
    raise KeyError(rel)


def edges() -> list[tuple[str, str]]:
    return sorted({(module_name(f), imp) for f in PACKAGE.rglob("*.py") for imp in imports_of(f)})


def test_the_table_lists_every_top_level_module():
    table = layer_table()
    assert table, f"no layer table found in {DOC}"
    for f in PACKAGE.rglob("*.py"):
        name = module_name(f)
        try:
            locate(name, table)
        except KeyError:
            pytest.fail(f"{name} is in no layer of docs/architecture.md: add it to the table")


def test_every_import_goes_downward():
    table = layer_table()
    bad = []
    for src, dst in edges():
        (s_key, s_layer), (d_key, d_layer) = locate(src, table), locate(dst, table)
        same_package = src.split(".")[:2] == dst.split(".")[:2]
        if d_layer < s_layer or (same_package and d_layer <= s_layer) or s_key == d_key:
            continue
        bad.append(f"{src} (layer {s_layer}, {s_key}) imports {dst} (layer {d_layer}, {d_key})")
    assert not bad, "imports the layer table of docs/architecture.md does not allow:\n" + "\n".join(bad)


def test_the_checker_catches_an_upward_import(tmp_path):
    """The parser sees imports inside functions and relative imports (a check that could not fail is no check)."""
    src = tmp_path / "probe.py"
    src.write_text("def f():\n    from deepgen_rl.trainer import grpo_trainer\nfrom .. import rollout\n")
    found = imports_of(src, "deepgen_rl.rl.probe")
    assert "deepgen_rl.trainer.grpo_trainer" in found and "deepgen_rl.rollout" in found
    table = layer_table()
    assert locate("deepgen_rl.trainer.grpo_trainer", table)[1] > locate("deepgen_rl.rl.samplers", table)[1]


def test_no_function_takes_the_trainer():
    """Functions take what they use (CONTRIBUTING.md rule 9): no parameter named ``trainer`` anywhere in the package
    (the trainer's own methods take ``self``)."""
    bad = []
    for f in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(a.arg == "trainer" for a in args):
                    bad.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not bad, "functions that take the whole trainer:\n" + "\n".join(bad)
