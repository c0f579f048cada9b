"""The layout's import rules, read from the source: `kernels` stands alone, `envs` knows no `marl`, and no
library module imports a benchmark module (`marl bench` is dispatched from `marl.app.cli.main` only)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[tuple[str, bool]]:
    """Every module `path` imports, and whether the import sits at module level (else inside a function)."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, id(node) in top))
    return found


def library_files(package: str) -> list[Path]:
    return [p for p in (ROOT / package).rglob("*.py") if "bench" not in p.relative_to(ROOT).parts]


def test_the_tree_is_read():
    assert len(library_files("marl")) > 20 and len(library_files("envs")) > 15 and len(library_files("kernels")) >= 3


def test_kernels_import_neither_envs_nor_marl():
    for path in library_files("kernels"):
        bad = [m for m, _ in imported_modules(path) if m.split(".")[0] in ("envs", "marl")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_envs_never_import_marl():
    for path in (ROOT / "envs").rglob("*.py"):
        bad = [m for m, _ in imported_modules(path) if m.split(".")[0] == "marl"]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_no_library_module_imports_a_benchmark():
    for package in ("marl", "envs", "kernels"):
        for path in library_files(package):
            for module, top_level in imported_modules(path):
                if "bench" in module.split("."):
                    # The one exception: `marl bench` hands its arguments to the benchmark, imported there.
                    assert path.relative_to(ROOT).as_posix() == "marl/app/cli.py" and not top_level, (
                        f"{path.relative_to(ROOT)} imports {module}"
                    )
