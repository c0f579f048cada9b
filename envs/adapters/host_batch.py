"""A batch of host (numpy) data moved to the device in one copy per dtype.

Adapters of host simulators write each env's numpy outputs into named arrays; `upload()` moves them
all to the device at once and hands back device tensors with the same names and shapes. The arrays
are carved out of one flat buffer per dtype (pinned when the device is CUDA, so the copy runs
asynchronously), each name a contiguous segment, so every device tensor is contiguous too.

    batch = HostBatch({"obs": ((B, n, 18), torch.float32), "done": ((B,), torch.bool)}, device)
    batch.arrays["obs"][i] = observation_of_env_i        # numpy views, written in place
    tensors = batch.upload()                             # {"obs": [B, n, 18], "done": [B]} on device
"""

from __future__ import annotations

import math

import numpy as np
import torch


class HostBatch:
    def __init__(self, layout: dict[str, tuple[tuple[int, ...], torch.dtype]], device: torch.device) -> None:
        """`layout` maps name -> (shape, torch dtype); the arrays start zeroed."""
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        offsets: dict[torch.dtype, int] = {}
        self._segments: dict[str, tuple[torch.dtype, int, int, tuple[int, ...]]] = {}
        for name, (shape, dtype) in layout.items():
            start = offsets.get(dtype, 0)
            self._segments[name] = (dtype, start, math.prod(shape), tuple(shape))
            offsets[dtype] = start + math.prod(shape)
        self._flat = {dtype: torch.zeros(size, dtype=dtype, pin_memory=cuda) for dtype, size in offsets.items()}
        self.arrays: dict[str, np.ndarray] = {
            name: self._flat[dtype].numpy()[start : start + size].reshape(shape)
            for name, (dtype, start, size, shape) in self._segments.items()
        }
        self._copied: torch.cuda.Event | None = None

    def wait(self) -> None:
        """Block until the last upload has read the pinned buffers; call before writing the arrays."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    def upload(self) -> dict[str, torch.Tensor]:
        """Fresh device tensors holding the arrays' current values (later writes do not change them)."""
        if self.device.type == "cpu":
            flat = {dtype: buffer.clone() for dtype, buffer in self._flat.items()}
        else:
            cuda = self.device.type == "cuda"
            flat = {dtype: buffer.to(self.device, non_blocking=cuda) for dtype, buffer in self._flat.items()}
            if cuda:
                self._copied = torch.cuda.Event()
                self._copied.record()
        return {
            name: flat[dtype][start : start + size].view(shape)
            for name, (dtype, start, size, shape) in self._segments.items()
        }
