"""The accountant gives back what big compositions leave behind (issue 45: the API's memory
after 10⁷-scale creates): scipy.fft's cached plans and the allocator's free pages; no number
changes."""

from __future__ import annotations

import os

import numpy as np
import pytest
from scipy import fft

from dprc_core.accounting import SubsampledGaussianEvent, epsilon_for_events, memory
from dprc_core.accounting import history as hist


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux /proc only")
def test_big_plans_are_given_back() -> None:
    memory.release_memory()
    before = _rss_mib()
    for n in (fft.next_fast_len(3_000_000), fft.next_fast_len(4_000_000)):
        x = np.ones(n // 2)
        fft.ifft(fft.fft(x, n) ** 2)  # the self-composition's transforms
        fft.irfft(fft.rfft(x, n), n)  # fftconvolve's
    del x
    grown = _rss_mib() - before
    assert grown > 100  # the plans of four transforms of millions of points stay cached
    memory.release_memory()
    assert _rss_mib() - before < 16


def _from_nothing(monkeypatch) -> None:
    """No transform or temporary counted yet (other tests in this process compose)."""
    for name, value in (
        ("_big_bytes", 0),
        ("_temporary_bytes", 0),
        ("_big_since_release", False),
        ("_big_temporaries", False),
    ):
        monkeypatch.setattr(memory, name, value)


def test_release_only_after_big_transforms_worth_it(monkeypatch) -> None:
    """Transforms below BIG_TRANSFORM never count; big ones release once they may hold
    RELEASE_BYTES (16 bytes a point), at once for a transform that big alone, and once."""
    calls = []
    monkeypatch.setattr(memory, "release_memory", lambda: calls.append(1))
    _from_nothing(monkeypatch)
    for _ in range(1000):
        memory.note_transform(memory.BIG_TRANSFORM - 1)
    assert not memory.release_if_big()
    per_release = memory.RELEASE_BYTES // (16 * memory.BIG_TRANSFORM)  # 32 such transforms
    for _ in range(per_release - 1):
        memory.note_transform(memory.BIG_TRANSFORM)
    assert not memory.release_if_big()
    memory.note_transform(memory.BIG_TRANSFORM)
    assert memory.release_if_big()
    assert not memory.release_if_big()  # once
    memory.note_transform(memory.RELEASE_BYTES // 16)  # one transform worth a release
    assert memory.release_if_big()
    assert calls == [1, 1]


def test_trim_only_after_big_temporaries_worth_it(monkeypatch) -> None:
    trims = []
    monkeypatch.setattr(memory, "trim_heap", lambda: trims.append(1))
    monkeypatch.setattr(memory, "release_memory", lambda: None)
    _from_nothing(monkeypatch)
    memory.note_temporaries(memory.BIG_TRANSFORM)
    assert not memory.trim_if_big()
    memory.note_temporaries(memory.RELEASE_BYTES // 16)
    assert memory.trim_if_big()
    assert not memory.trim_if_big()
    assert trims == [1]


def test_compositions_note_their_transforms(monkeypatch) -> None:
    seen: list[int] = []
    monkeypatch.setattr(
        "dprc_core.accounting.pld_self_compose.note_transform", lambda n: seen.append(n)
    )
    hist.clear_cache()
    epsilon_for_events([SubsampledGaussianEvent(1.0, 0.01, 500)], 1e-5)
    assert seen and max(seen) > 1000


def test_release_changes_no_epsilon() -> None:
    events = [SubsampledGaussianEvent(0.8, 0.001, 3000), SubsampledGaussianEvent(1.0, 0.01, 50)]
    hist.clear_cache()
    first = hist.epsilon_for_history(events, 1e-6)
    memory.release_memory()
    hist.clear_cache()
    assert hist.epsilon_for_history(events, 1e-6) == first
