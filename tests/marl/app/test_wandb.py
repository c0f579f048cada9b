"""Weights & Biases logging (`marl train --wandb`), offline: no network, every file under tmp_path. The runs
are read back from W&B's own transaction log (`run-<id>.wandb`: its records are W&B's protobuf messages)."""

import csv
import dataclasses
import importlib.util
import json
import math
import struct
import zlib
from pathlib import Path

import pytest

from marl.app import wandb_logging
from marl.app.cli import main
from marl.app.trainer import Trainer
from tests.marl.app.test_seeds import tiny_argv, tiny_config, with_run

BLOCK = 32 * 1024  # the log is written in blocks; a record's chunk never crosses one
CHUNK_HEADER = struct.Struct("<IHB")  # crc32 of (type byte + data), data length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list:
    """The protobuf records of a `.wandb` file: a 7-byte header (":W&B", magic 0xBEE1, version 0), then
    LevelDB-style log blocks of checksummed chunks, a record split over FIRST, MIDDLE..., LAST chunks."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    records, pending, pos = [], b"", 7
    while pos + CHUNK_HEADER.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER.size:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if kind == 0:  # zeros: the rest of the block is padding
            pos += left
            continue
        chunk = data[pos + CHUNK_HEADER.size : pos + CHUNK_HEADER.size + length]
        assert zlib.crc32(bytes([kind]) + chunk) == crc and kind in (FULL, FIRST, MIDDLE, LAST)
        pending += chunk
        pos += CHUNK_HEADER.size + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@dataclasses.dataclass
class OfflineRun:
    name: str
    group: str
    config: dict
    history: list[dict]  # one dict per logged step, W&B's own `_step`, `_runtime`, ... left out
    steps: list[int]
    exit_code: int | None  # None: never finished


def offline_runs(wandb_dir: Path, run_id: str) -> list[OfflineRun]:
    """Every offline run with id `run_id` under `wandb_dir` (a resumed run writes a second one), oldest first."""
    import wandb

    wandb.teardown()  # W&B's service writes the files in the background: stopping it flushes them
    runs = []
    for path in sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")):
        records = read_records(path)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        config = {item.key: json.loads(item.value_json) for item in run.config.update if item.key != "_wandb"}
        history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
        rows = [
            {
                item.nested_key[0]: json.loads(item.value_json)
                for item in h.item
                if not item.nested_key[0].startswith("_")
            }
            for h in history
        ]
        exits = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
        runs.append(
            OfflineRun(run.display_name, run.run_group, config, rows, [h.step.num for h in history], *exits or [None])
        )
    return runs


def csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def assert_same_rows(logged: list[dict], written: list[dict]) -> None:
    assert len(logged) == len(written)
    for row, expected in zip(logged, written):
        assert row.keys() == expected.keys()
        for key, value in expected.items():
            assert row[key] == value or (math.isnan(value) and math.isnan(row[key])), key


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """W&B offline, its files under tmp_path/wandb_dir."""
    pytest.importorskip("wandb")
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return wandb_dir


def test_each_member_logs_its_metrics_csv_to_its_own_run_in_the_populations_group(tmp_path, offline, capsys):
    argv = ["train", *tiny_argv(tmp_path), "--seeds", "0", "1", "--wandb", "--wandb-project", "tests"]
    assert main(argv) == 0
    run_dir = tmp_path / "run"
    for seed in (0, 1):
        member = run_dir / f"seed_{seed}"
        (logged,) = offline_runs(offline, (member / wandb_logging.RUN_ID_FILE).read_text().strip())
        assert (logged.name, logged.group, logged.exit_code) == (f"run/seed_{seed}", "run", 0)
        assert logged.config["run"]["seed"] == seed and logged.config["algo"]["algo"] == "mappo"
        written = csv_rows(member / "metrics.csv")
        assert_same_rows(logged.history, written)
        assert logged.steps == [int(row["frames"]) for row in written] == [64, 128]


def test_a_run_that_dies_finishes_its_wandb_run_and_resumes_it(tmp_path, offline):
    """Training dies at iteration 3: its W&B run is finished as failed and the last checkpoint (iteration 2)
    is kept; the resumed run logs iterations 3 and 4 to the same W&B run (id)."""
    config = with_run(tiny_config(tmp_path), total_frames=16 * 8 * 4, checkpoint_every=2, wandb=True)
    trainer = Trainer(config)
    train_iteration = trainer.train_iteration

    def iteration_or_crash():
        if trainer.iteration == 2:
            raise RuntimeError("the device fell over")
        return train_iteration()

    trainer.train_iteration = iteration_or_crash
    with pytest.raises(RuntimeError, match="fell over"):
        trainer.train()
    run_dir = tmp_path / "run"
    run_id = (run_dir / wandb_logging.RUN_ID_FILE).read_text().strip()
    (died,) = offline_runs(offline, run_id)
    assert died.exit_code == 1 and (died.name, died.group) == ("run", "")
    # W&B names an offline run's folder by its id and the second it starts: moved aside, so that a resume
    # within the same second does not write into it.
    (folder,) = offline.glob(f"wandb/offline-run-*-{run_id}")
    folder.rename(folder.with_name(f"died-{folder.name}"))
    assert Trainer.resume(run_dir / "checkpoint.pt").train()
    (resumed,) = offline_runs(offline, run_id)
    assert resumed.exit_code == 0 and resumed.config["run"]["seed"] == config.run.seed
    assert_same_rows(died.history + resumed.history, csv_rows(run_dir / "metrics.csv"))


def test_wandb_without_the_package_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    assert main(["train", *tiny_argv(tmp_path), "--wandb"]) == 2
    assert 'which is not installed: pip install "vecmarl[wandb]"' in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.csv").exists()


def test_a_bad_wandb_mode_is_refused(tmp_path, capsys):
    assert main(["train", *tiny_argv(tmp_path), "--wandb", "--wandb-mode", "ofline"]) == 2
    assert "wandb_mode must be one of ['online', 'offline', 'disabled']" in capsys.readouterr().err


def test_wandb_online_without_an_api_key_is_one_line_saying_what_to_do(tmp_path, monkeypatch, capsys):
    # A first `--wandb` before `wandb login`: W&B's own UsageError came out as a traceback through its code.
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no W&B settings: no key anywhere
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    assert main(["train", *tiny_argv(tmp_path), "--wandb", "--wandb-mode", "online"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("marl train: error: --wandb: W&B could not start the run (No API key configured")
    assert "--wandb-mode offline" in line
