import numpy as np
import pytest
import torch

from envs.adapters.host_batch import HostBatch


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_upload_gives_contiguous_snapshots(device):
    batch = HostBatch(
        {"obs": ((3, 2, 4), torch.float32), "done": ((3,), torch.bool), "rew": ((3, 2), torch.float32)}, device
    )
    batch.arrays["obs"][1] = np.arange(8).reshape(2, 4)
    batch.arrays["done"][2] = True
    first = batch.upload()
    batch.wait()
    batch.arrays["obs"][1] = -1.0
    second = batch.upload()
    assert first["obs"].is_contiguous() and first["obs"].shape == (3, 2, 4) and first["obs"].device.type == device
    assert first["obs"][1].flatten().tolist() == list(range(8)) and (second["obs"][1] == -1).all()
    assert first["done"].tolist() == [False, False, True] and (first["rew"] == 0).all()
