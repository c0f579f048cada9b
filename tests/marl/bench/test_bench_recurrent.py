"""`python -m marl.bench.recurrent`: its time-pass table (numbers mean nothing here) and its argument checks."""

import pytest

from marl.bench.recurrent import main, time_pass


def test_the_time_pass_table_names_each_way_with_a_ratio_to_the_scan(capsys):
    main(["--parts", "time_pass", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "command: python -m marl.bench.recurrent --parts time_pass --repeats 1" in out
    assert "chunks 256, chunk_length 16, n_agents 3, inputs 18, hidden 64" in out
    assert "| scan | " in out and "| 1.00 |" in out and "| torch.nn.GRU (no resets) | " in out


def test_time_pass_rows():
    rows = time_pass(2, chunks=4, chunk_length=3, n_agents=2, inputs=5, hidden=8)
    assert [row["way"] for row in rows] == ["scan", "torch.nn.GRU (no resets)"]
    assert rows[0]["ratio"] == 1.0 and all(row["seconds"] > 0 for row in rows)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        main(["--iterations", "1"])
