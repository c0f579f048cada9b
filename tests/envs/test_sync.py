import pytest
import torch

from envs.sync import HostSyncError, allow_host_sync, forbid_host_sync

x = torch.randn(6)


@pytest.mark.parametrize(
    "operation",
    [
        lambda: x[0].item(),
        lambda: x.tolist(),
        lambda: x.numpy(),
        lambda: x.cpu(),
        lambda: bool(x.sum() > 0),
        lambda: int(x[0]),
        lambda: float(x[0]),
        lambda: x[x > 0],
        lambda: x.__setitem__(x > 0, 0.0),
        lambda: x.nonzero(),
        lambda: torch.where(x > 0),
        lambda: x.unique(),
        lambda: torch.repeat_interleave(x, torch.ones(6, dtype=torch.long)),
    ],
    ids=[
        "item",
        "tolist",
        "numpy",
        "cpu",
        "bool",
        "int",
        "float",
        "mask_index",
        "mask_assign",
        "nonzero",
        "where_1arg",
        "unique",
        "repeat_interleave_tensor",
    ],
)
def test_syncing_operations_raise(operation):
    with pytest.raises(HostSyncError, match="host sync"), forbid_host_sync():
        operation()


def test_device_side_operations_pass():
    with forbid_host_sync():
        y = torch.where(x > 0, x, 0.0).cumsum(0)
        y = y[torch.arange(3)] + x[1:4] * x.argmax()
        torch.rand(3, generator=torch.Generator())
    assert y.shape == (3,)


def test_allow_host_sync_lifts_the_guard_for_its_block_only():
    with forbid_host_sync():
        with allow_host_sync():
            assert x[x > 0].numel() == int((x > 0).sum())
        with pytest.raises(HostSyncError, match="host sync"):
            x.sum().item()


def test_error_names_the_line_that_synced():
    def reset(mask):
        if mask.any():
            pass

    with pytest.raises(HostSyncError, match=r"test_sync\.py:\d+ in reset: `if mask\.any\(\):`"), forbid_host_sync():
        reset(x > 0)
    with pytest.raises(HostSyncError, match=r"in test_error_names_the_line_that_synced: `x\[x > 0\]`"):
        with forbid_host_sync():
            x[x > 0]
