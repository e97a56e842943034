"""``/proc`` memory readers (Linux): RSS, peak RSS (``VmHWM``) and its reset through
``clear_refs``, and a thread that samples RSS where the reset is refused. Standard library
only: importing this must not move the RSS it measures."""

from __future__ import annotations

import os
import threading
from pathlib import Path

MIB = 2**20


def status_kib(field: str, pid: int | str = "self") -> int:
    """A ``/proc/<pid>/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def rss_bytes() -> int:
    return status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    return status_kib("VmHWM") * 1024


def statm_rss_bytes() -> int:
    """Resident pages of ``/proc/self/statm`` in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak(pid: int | str = "self") -> bool:
    """Restart ``pid``'s VmHWM from its current RSS (Linux ≥ 4.0); False when the kernel
    refuses (then the peak since start-up counts, an over-estimate)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def reset_peak_checked() -> None:
    """Reset VmHWM to the current RSS and check that the kernel did it."""
    Path("/proc/self/clear_refs").write_text("5")
    rss, hwm = status_kib("VmRSS"), status_kib("VmHWM")
    if hwm > rss + 1024:
        raise RuntimeError(f"clear_refs did not reset VmHWM (VmHWM {hwm} kB, VmRSS {rss} kB)")


def proc_memory(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (MiB) of ``pid``."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0]) / 1024
    return out


class PeakRSS:
    """The peak RSS (bytes) of a phase: VmRSS sampled by a background thread every ``every``
    seconds and, with ``reset_hwm``, VmHWM reset at its start; :meth:`peak` is the larger."""

    def __init__(self, every: float = 0.005, reset_hwm: bool = True):
        self.every = every
        self.reset_hwm = reset_hwm
        self.sampled = 0
        self.hwm_reset = False
        self.hwm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sampled = max(self.sampled, rss_bytes())
            self._stop.wait(self.every)

    def __enter__(self) -> PeakRSS:
        self.hwm_reset = self.reset_hwm and reset_peak()
        self.sampled = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sampled = max(self.sampled, rss_bytes())
        self.hwm = peak_rss_bytes() if self.hwm_reset else 0

    def peak(self) -> int:
        return max(self.sampled, self.hwm)
