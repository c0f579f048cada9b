"""The README's commands are the ones CI and users run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def quickstart_commands() -> list[str]:
    section = README.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_quickstart_has_the_two_commands():
    main_job, tests = quickstart_commands()
    assert main_job == "pip install -e . && marl train"
    assert tests == 'pip install -e ".[test]" && python -m pytest -q -n auto'


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grep -m1 '^pip install -e \"\\.\\[test\\]\" && ' README.md" in ci
    assert 'eval "$test_command"' in ci
    assert "pip install -q torch==2.13.0" in ci


def test_files_the_docs_name_exist():
    # A path in backticks in the README, a tutorial or a docstring is where a reader goes next; moved
    # files left the tutorial pointing at envs/navigation.py (now envs/native/navigation.py).
    documents = [
        ROOT / "README.md",
        *ROOT.glob("tutorials/*.py"),
        *ROOT.glob("envs/**/*.py"),
        *ROOT.glob("marl/**/*.py"),
    ]
    pattern = r"`((?:envs|marl|tests|tutorials|kernels)/[\w./-]+\.(?:py|md))`"
    missing = [
        f"{document.relative_to(ROOT)}: {path}"
        for document in documents
        for path in re.findall(pattern, document.read_text())
        if not (ROOT / path).exists()
    ]
    assert not missing, missing
