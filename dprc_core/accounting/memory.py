"""Giving back the memory of big compositions (issue 45: a 10⁷-example create's calibration
left the API process ~130–155 MiB above its start).

Two things keep it after a calibration of ~10⁴ steps, neither of them a PLD:

* **scipy.fft's plan cache.** pocketfft (``scipy.fft``, hence ``signal.fftconvolve`` and
  dp_accounting's self-composition) keeps the plans — twiddle tables, about 16 bytes a point —
  of the last 16 transform lengths above 50 of each kind in a process-wide cache with no API
  to clear it. A calibration self-composes PMFs of a few million points at a different length
  for each σ, so up to 16 such plans (tens of MiB each) outlive it. :func:`clear_fft_plans`
  evicts them by transforming 16 small lengths of each kind (plans of a few hundred bytes);
  a plan still in use by another thread stays alive until that thread is done with it.
* **glibc's free lists.** The composition's arrays of a few MiB are freed to the allocator,
  which keeps them (its mmap threshold grows with the blocks freed, and each request thread
  has its own arena). :func:`trim_heap` calls ``malloc_trim(0)`` (glibc only; elsewhere it
  does nothing), which returns the free pages of every arena to the system.

Neither changes any number: plans are recomputed on demand, identically.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

import numpy as np
from scipy import fft

# pocketfft caches the plans of the last 16 lengths above 50 (pocketfft_hdronly: get_plan,
# nmax = 16; shorter lengths are never cached); evicting takes 16 other lengths
_PLAN_CACHE_SIZE = 16
_EVICT_LENGTHS = tuple(range(51, 51 + 2 * _PLAN_CACHE_SIZE))

# Transforms of at least this many points count towards a release (smaller plans: at most
# 16 × 32,768 points × 16 bytes ≈ 8 MiB a kind, left alone)
BIG_TRANSFORM = 1 << 15
# A release waits until the big transforms (or temporaries) since the last one may hold this
# much (16 bytes a point: a plan's twiddles, a complex temporary): one transform of a 10⁷-scale
# create's millions of points releases at once, as before, while a busy server's budget
# checks of some 10⁵ points each release every few checks instead of after every one (each
# release evicts the plans the next check builds again, and trims every thread's arena: 17 %
# of the snapshots' time in the burst of docs/benchmarks/budget.md before)
RELEASE_BYTES = 16 << 20
_BYTES_PER_POINT = 16
_big_bytes = 0
_temporary_bytes = 0
_big_since_release = False
_big_temporaries = False

_LIBC: ctypes.CDLL | None = None
_LIBC_GUARD = threading.Lock()


def note_transform(length: int) -> None:
    """Record an FFT of ``length`` points (the accountant's compositions call this): once the
    transforms of :data:`BIG_TRANSFORM` points or more since the last release count
    :data:`RELEASE_BYTES` at 16 bytes a point, the next :func:`release_if_big` releases."""
    global _big_since_release, _big_bytes  # noqa: PLW0603 - a flag and its count
    if length >= BIG_TRANSFORM:
        _big_bytes += _BYTES_PER_POINT * length
        if _big_bytes >= RELEASE_BYTES:
            _big_since_release = True


def note_temporaries(length: int) -> None:
    """Record temporary arrays of ``length`` points and no transform (ε of a composed PMF,
    e.g. a cached composition read again): once those of :data:`BIG_TRANSFORM` points or more
    since the last trim count :data:`RELEASE_BYTES` at 16 bytes a point, the next
    :func:`trim_if_big` trims the heap (their freed pages stay with the allocator
    otherwise: its mmap threshold has grown past them)."""
    global _big_temporaries, _temporary_bytes  # noqa: PLW0603 - a flag and its count
    if length >= BIG_TRANSFORM:
        _temporary_bytes += _BYTES_PER_POINT * length
        if _temporary_bytes >= RELEASE_BYTES:
            _big_temporaries = True


def release_if_big() -> bool:
    """:func:`release_memory` when a big transform ran since the last release (a calibration or
    a budget check of a big job); otherwise nothing (the small creates pay nothing)."""
    global _big_since_release, _big_temporaries, _big_bytes, _temporary_bytes  # noqa: PLW0603
    if not _big_since_release:
        return False
    _big_since_release = _big_temporaries = False
    _big_bytes = _temporary_bytes = 0
    release_memory()
    return True


def trim_if_big() -> bool:
    """:func:`release_if_big`, or :func:`trim_heap` alone when only big temporaries were freed
    since (:func:`note_temporaries`). Once after several compositions: each trim hands the
    pages back and the next composition faults them in again."""
    global _big_temporaries, _temporary_bytes  # noqa: PLW0603 - a flag and its count
    if release_if_big():
        return True
    if not _big_temporaries:
        return False
    _big_temporaries = False
    _temporary_bytes = 0
    trim_heap()
    return True


def clear_fft_plans() -> None:
    """Evict scipy.fft's cached plans (complex and real transforms, double precision) by
    transforming small lengths that nothing else uses."""
    for n in _EVICT_LENGTHS:
        x = np.ones(n)
        fft.irfft(fft.rfft(x), n)  # real plans (rfft/irfft, signal.fftconvolve)
        fft.ifft(fft.fft(x.astype(np.complex128)))  # complex plans (fft/ifft of self_compose)


def _libc() -> ctypes.CDLL | None:
    global _LIBC  # noqa: PLW0603 - loaded once
    with _LIBC_GUARD:
        if _LIBC is None:
            name = ctypes.util.find_library("c")
            if name is None:
                return None
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                return None
            if not hasattr(lib, "malloc_trim"):
                return None
            lib.malloc_trim.argtypes = [ctypes.c_size_t]
            lib.malloc_trim.restype = ctypes.c_int
            _LIBC = lib
        return _LIBC


def trim_heap() -> bool:
    """Return the allocator's free memory to the system (glibc's ``malloc_trim(0)``); False
    where there is no glibc."""
    lib = _libc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True


def release_memory() -> None:
    """What a big composition leaves behind, given back: scipy.fft's plans, then the heap's
    free pages (:func:`clear_fft_plans`, :func:`trim_heap`). A few milliseconds."""
    clear_fft_plans()
    trim_heap()


__all__ = [
    "BIG_TRANSFORM",
    "clear_fft_plans",
    "note_temporaries",
    "note_transform",
    "release_if_big",
    "release_memory",
    "trim_heap",
    "trim_if_big",
]
