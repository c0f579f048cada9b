import pytest


@pytest.fixture
def not_python(tmp_path):
    """Peer interpreters that are not one, with the reason a benchmark gives: a program that exits 0 printing
    nothing (as /bin/true does) and a file that is not executable."""
    program = tmp_path / "true"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    text = tmp_path / "notes.txt"
    text.write_text("python\n")
    return [(program, "it is not a working Python"), (text, "not an executable file")]
