import numpy as np
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


@pytest.mark.parametrize("device", [None, "cpu"], ids=["no_device", "cpu_as_remote"])
def test_one_hot_with_num_classes_passes_as_it_does_on_cuda(device):
    # On CUDA F.one_hot(index, n) leaves the range check to a device assert; on the CPU it reads the indices'
    # min and max on the host, which failed check_env for an env that never syncs on a GPU.
    index = torch.tensor([0, 2, 1])
    with forbid_host_sync(device):
        a = torch.nn.functional.one_hot(index, 3)
        b = torch.nn.functional.one_hot(index, num_classes=3)
    assert torch.equal(a, torch.eye(3, dtype=torch.long)[[0, 2, 1]]) and torch.equal(a, b)


def test_one_hot_without_num_classes_raises_saying_to_pass_it():
    # Without num_classes, one_hot reads the largest index on the host, on CUDA too.
    with (
        pytest.raises(HostSyncError, match=r"one_hot without num_classes .*; pass num_classes\) is not allowed"),
        forbid_host_sync(),
    ):
        torch.nn.functional.one_hot(torch.tensor([0, 2, 1]))


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


# Host->device copies, checked with `forbid_host_sync(device)`: for the `meta` device as a GPU run checks
# them (CPU tensors are host tensors), and for the CPU treated as remote, as CI checks a loop on the CPU.
REMOTE = ["cpu", "meta"]


@pytest.mark.parametrize("device", REMOTE)
@pytest.mark.parametrize(
    ("operation", "op"),
    [
        (lambda d, dev: torch.tensor(3.0, device=d), r"\(torch\.tensor\)"),
        (lambda d, dev: torch.as_tensor([1.0, 2.0], device=d), r"\(torch\.as_tensor\)"),
        (lambda d, dev: torch.asarray(np.ones(2), device=d), r"\(torch\.asarray\)"),
        (lambda d, dev: dev.new_tensor([1.0, 2.0]), r"\(\.new_tensor\)"),
        (lambda d, dev: torch.as_tensor(torch.ones(3), device=d), r"moving a host tensor .*\(torch\.as_tensor\)"),
        (lambda d, dev: torch.zeros(3).to(d), r"moving a host tensor to the device \(\.to\)"),
        (lambda d, dev: torch.ones(3).to(device=d, dtype=torch.float64), r"\(\.to\)"),
        (lambda d, dev: torch.arange(3).float().mul(2).to(d), r"\(\.to\)"),
        (lambda d, dev: torch.ones(3).cuda(), r"\(\.cuda\(\)\)"),
        (lambda d, dev: dev.copy_(torch.ones(3)), r"copy_ from a host tensor into a device tensor"),
        (lambda d, dev: dev.__setitem__(slice(0, 2), torch.ones(2)), r"assigning a host tensor"),
    ],
    ids=[
        "tensor",
        "as_tensor_list",
        "asarray_numpy",
        "new_tensor",
        "as_tensor_host_tensor",
        "to",
        "to_kwargs",
        "to_after_host_ops",
        "cuda",
        "copy_",
        "setitem",
    ],
)
def test_host_to_device_copies_raise(device, operation, op):
    dev = torch.zeros(3, device=device)  # made before the block: lives on the device
    with pytest.raises(HostSyncError, match=rf"^host-to-device copy: .*{op}.* \(at .*test_sync\.py:\d+ in <lambda>"):
        with forbid_host_sync(device):
            operation(device, dev)


@pytest.mark.parametrize("device", REMOTE)
def test_device_allocations_and_device_ops_pass(device):
    dev = torch.zeros(3, device=device)
    with forbid_host_sync(device):
        made = [
            torch.zeros(3, device=device),
            torch.full((3,), 2.0, device=device),
            torch.empty(3, device=device),
            torch.arange(3, device=device, dtype=torch.float32),
            torch.randn(3, device=device),
            torch.zeros_like(dev),
            dev.new_zeros(3),
        ]
        y = sum(made) * dev + dev.to(device) + torch.as_tensor(dev)  # between device tensors; .to is a no-op
        y.copy_(dev)
        y[:2] = dev[1:]
        y = y * torch.tensor(2.0) + 1.0  # a 0-d host tensor is read as a scalar, not copied
        y[0] = torch.tensor(1.0)
        host = torch.zeros(3).add(1).to(torch.float64)  # host tensors staying on the host
    assert y.device.type == device and host.device.type == "cpu"


def test_on_a_real_device_every_cpu_tensor_is_a_host_tensor():
    made_before = torch.ones(3)  # made before the block, even from numpy (`torch.from_numpy` is not seen)
    for host in (made_before, torch.from_numpy(np.ones(3))):
        with pytest.raises(HostSyncError, match=r"\(\.to\)"), forbid_host_sync("meta"):
            host.to("meta")


def test_host_to_device_copies_pass_without_a_device_and_under_allow_host_sync():
    with forbid_host_sync():  # no target device: only device->host syncs are checked
        torch.tensor(3.0, device="meta")
        torch.zeros(3).to("meta")
    with forbid_host_sync("meta"), allow_host_sync():
        torch.zeros(3).to("meta")


def test_copy_error_names_the_line():
    def advantages(target):
        return target.sum() / torch.tensor(float(target.numel()), dtype=torch.float64, device=target.device)

    match = r"^host-to-device copy: building a tensor .* in advantages: `return target\.sum\(\) / torch\.tensor"
    with pytest.raises(HostSyncError, match=match), forbid_host_sync("cpu"):
        advantages(torch.ones(4))
