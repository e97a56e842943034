"""Torch devices: synchronisation and the peak memory of what runs between two points, from
``torch.cuda.max_memory_allocated`` on CUDA or the process's peak RSS on the CPU."""

from __future__ import annotations

import gc

import torch

from benchmarks.kit import memory


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def hwm_reset_works() -> bool:
    """Allocate and free 64 MiB, reset: the peak must drop back to about the current RSS."""
    if not memory.reset_peak():
        return False
    x = torch.ones(16 * memory.MIB)  # 64 MiB, touched
    del x
    if not memory.reset_peak():
        return False
    return memory.peak_rss_bytes() - memory.rss_bytes() < 16 * memory.MIB


class Memory:
    """Peak memory of what runs between ``reset()`` and ``peak_mib()``: on CUDA
    ``max_memory_allocated``; on the CPU the process's peak RSS (VmHWM after
    ``echo 5 > /proc/self/clear_refs``). ``checked``: a refused reset on the CPU is an error
    (else the peak then includes what ran before)."""

    def __init__(self, device: torch.device, checked: bool = False):
        self.device = device
        self.checked = checked

    def used_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / 2**20
        return memory.status_kib("VmRSS") / 1024

    def reset(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.checked:
            memory.reset_peak_checked()
        else:
            memory.reset_peak()

    def peak_mib(self) -> float:
        if self.device.type == "cuda":
            sync(self.device)
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return memory.status_kib("VmHWM") / 1024
