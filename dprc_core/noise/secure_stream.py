"""A cryptographic random stream for DP noise, Poisson masks and projections (secure mode).

**Generator.** The ChaCha20 keystream (RFC 8439) as implemented by OpenSSL, through the
``cryptography`` package: ``encrypt(zeros)`` with a 256-bit key. Whoever does not know the key
cannot predict any part of the stream from any other part, nor from torch's generators, the
model's initialisation or a seed — the key is 32 bytes from ``os.urandom`` unless given.

**Layout.** A :class:`SecureStream` is a key, a 63-bit ``stream_id`` and a position counted in
64-bit words. Word ``w`` of the stream is bytes ``[8w, 8w + 8)`` (little-endian) of the
keystream whose 64-byte block number ``b = 8w // 64`` is encoded as ChaCha20's 32-bit block
counter ``b mod 2³²`` and the first 4 bytes of the 96-bit nonce ``⌊b / 2³²⌋``; the last 8 nonce
bytes hold ``stream_id``. A stream thus has 2⁶⁴ blocks and never depends on how OpenSSL carries
its 32-bit counter (requests are split at every 2³² block boundary). With ``stream_id`` and
``⌊b / 2³²⌋`` zero this is exactly the RFC's keystream (tested with its test vectors).

**Sub-streams.** :meth:`SecureStream.derive` gives an independent stream per purpose and index
with the key HMAC-SHA256(key, "dprc/secure-stream/v1/<purpose>/<index>"): e.g. ``"noise"`` per
rank (disjoint noise shards), ``"sampling"`` (one for all ranks: the same Poisson masks
everywhere), ``"projections"``. :meth:`SecureStream.at` picks another ``stream_id`` under the same
key (e.g. one per step or per parameter), so positions never have to be tracked across them.

**Draws** (all from whole 64-bit words, so positions are exact and resumable):

* :meth:`uniform`: ``⌊w / 2¹¹⌋ · 2⁻⁵³`` — every multiple of 2⁻⁵³ in [0, 1) with probability 2⁻⁵³.
* :meth:`bernoulli`: ``w < t`` with ``t = ⌊q · 2⁶⁴⌋`` computed exactly from the float ``q``
  (rational arithmetic), so P(True) = t / 2⁶⁴ ∈ (q − 2⁻⁶⁴, q]: never above q. The accountant's
  ε for Poisson sampling is non-decreasing in q, so accounting with q is an upper bound for the
  rate that is drawn. ``q = 1`` is always True.
* :meth:`normal`: float64 N(0, 1) as the **sum of** ``terms`` **normals** divided by √terms
  (Holohan & Braghin, "Secure random sampling in differential privacy", ESORICS 2021), each
  term a Box–Muller value from its own pair of 53-bit uniforms; the two halves of a pair go to
  two different outputs, never into one sum (cos θ + sin θ = √2 cos(θ − π/4) would be one
  sample again). A single Box–Muller value is a function of two 53-bit uniforms that can be
  inverted from the float it produced (the test suite does it); the sum of ``terms`` of them is
  not: 2·terms unknowns behind one value. Default ``terms = 4`` (as Opacus' secure mode).

The stream's state (:meth:`state_dict`) contains the **key**: it is as secret as the noise.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from fractions import Fraction

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

KEY_BYTES = 32
DEFAULT_TERMS = 4
# elements generated per chunk (the layout of the normals in the stream depends on it, so it is
# part of the state version)
NORMAL_CHUNK = 1 << 15
STATE_VERSION = 1

_BLOCK = 64  # bytes per ChaCha20 block
_WORDS_PER_BLOCK = _BLOCK // 8
_MAX_ID = 1 << 63
_MAX_WORDS = 1 << 63  # positions are kept in int64 tensors
_U53 = float(2.0**-53)
_TWO_PI = 2.0 * math.pi
_ZEROS = memoryview(bytes(1 << 20))  # the plaintext: the keystream is the encryption of zeros


def new_key() -> bytes:
    """256 bits from the operating system's CSPRNG."""
    return os.urandom(KEY_BYTES)


def _check_key(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"key must be {KEY_BYTES} bytes")
    return bytes(key)


def _check_index(name: str, value: int, limit: int = _MAX_ID) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise ValueError(f"{name} must be an integer in [0, {limit}), got {value!r}")
    return value


def derive_key(key: bytes, purpose: str, index: int = 0) -> bytes:
    """HMAC-SHA256(key, "dprc/secure-stream/v1/<purpose>/<index>"): an independent key."""
    if not isinstance(purpose, str) or not purpose or "/" in purpose:
        raise ValueError(f"purpose must be a non-empty string without '/', got {purpose!r}")
    _check_index("index", index)
    label = f"dprc/secure-stream/v1/{purpose}/{index}".encode()
    return hmac.new(_check_key(key), label, hashlib.sha256).digest()


def keystream_into(key: bytes, stream_id: int, first_block: int, out: memoryview) -> None:
    """Fill ``out`` (a multiple of 64 bytes) with the stream's blocks from ``first_block`` on."""
    n_blocks = len(out) // _BLOCK
    if len(out) % _BLOCK:
        raise ValueError("keystream_into needs whole 64-byte blocks")
    done = 0
    while done < n_blocks:
        block = first_block + done
        low, high = block & 0xFFFFFFFF, block >> 32
        take = min(n_blocks - done, (1 << 32) - low)  # never across a 2^32 block boundary
        nonce = low.to_bytes(4, "little") + high.to_bytes(4, "little")
        nonce += stream_id.to_bytes(8, "little")
        encryptor = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        part = out[done * _BLOCK : (done + take) * _BLOCK]
        for start in range(0, len(part), len(_ZEROS)):
            piece = part[start : start + len(_ZEROS)]
            encryptor.update_into(_ZEROS[: len(piece)], piece)
        done += take


class SecureStream:
    """ChaCha20 words at a position (see the module doc); ``key=None``: a fresh OS key."""

    def __init__(self, key: bytes | None = None, *, stream_id: int = 0, position: int = 0):
        self._key = new_key() if key is None else _check_key(key)
        self.stream_id = _check_index("stream_id", stream_id)
        self.position = _check_index("position", position, _MAX_WORDS)

    # -- sub-streams ----------------------------------------------------------------------------
    def derive(self, purpose: str, index: int = 0) -> SecureStream:
        """An independent stream (its own key) for ``purpose`` / ``index``, at position 0."""
        return SecureStream(derive_key(self._key, purpose, index))

    def at(self, stream_id: int) -> SecureStream:
        """Stream ``stream_id`` under the same key, at position 0."""
        return SecureStream(self._key, stream_id=stream_id)

    # -- raw words ------------------------------------------------------------------------------
    def words_into(self, out: np.ndarray) -> np.ndarray:
        """Fill the 1-D uint64 array ``out`` with the next ``len(out)`` words and advance."""
        if out.dtype != np.uint64 or out.ndim != 1 or not out.flags.c_contiguous:
            raise ValueError("out must be a contiguous 1-D uint64 array")
        n = int(out.shape[0])
        end = self.position + n
        if end > _MAX_WORDS:
            raise OverflowError("the stream is exhausted (2^63 words)")
        if n == 0:
            return out
        skip = self.position % _WORDS_PER_BLOCK
        first = self.position // _WORDS_PER_BLOCK
        if skip == 0 and n % _WORDS_PER_BLOCK == 0:
            keystream_into(self._key, self.stream_id, first, out.data.cast("B"))
        else:
            n_blocks = -(-(skip + n) // _WORDS_PER_BLOCK)
            buf = np.empty(n_blocks * _WORDS_PER_BLOCK, dtype=np.uint64)
            keystream_into(self._key, self.stream_id, first, buf.data.cast("B"))
            out[:] = buf[skip : skip + n]
        self.position = end
        return out

    def words(self, n: int) -> np.ndarray:
        """The next ``n`` words as a new uint64 array (little-endian keystream bytes)."""
        out = np.empty(_check_index("n", n, _MAX_WORDS), dtype=np.uint64)
        return self.words_into(out)

    def skip(self, n: int) -> None:
        """Advance by ``n`` words without drawing them."""
        end = self.position + _check_index("n", n, _MAX_WORDS)
        self.position = _check_index("position", end, _MAX_WORDS)

    # -- distributions --------------------------------------------------------------------------
    def uniform(self, n: int) -> torch.Tensor:
        """``n`` float64 uniforms on [0, 1): multiples of 2⁻⁵³, each with probability 2⁻⁵³."""
        return torch.from_numpy((self.words(n) >> np.uint64(11)).astype(np.float64)).mul_(_U53)

    def bernoulli(self, n: int, q: float) -> torch.Tensor:
        """``n`` independent booleans, True with probability ⌊q·2⁶⁴⌋/2⁶⁴ (≤ q, > q − 2⁻⁶⁴)."""
        threshold = bernoulli_threshold(q)
        words = self.words(n)
        if threshold == 1 << 64:
            return torch.ones(n, dtype=torch.bool)
        return torch.from_numpy(words < np.uint64(threshold))

    def normal(self, n: int, terms: int = DEFAULT_TERMS) -> torch.Tensor:
        """``n`` float64 N(0, 1) draws, each the sum of ``terms`` Box–Muller values / √terms."""
        out = torch.empty(_check_index("n", n, _MAX_WORDS), dtype=torch.float64)
        self.normal_into(out, terms=terms)
        return out

    def normal_into(
        self, out: torch.Tensor, *, terms: int = DEFAULT_TERMS, std: float = 1.0
    ) -> None:
        """Fill the CPU tensor ``out`` (any floating dtype, contiguous) with ``std`` · N(0, 1),
        generated in float64 (:meth:`normal`) and cast once at the end."""
        check_terms(terms)
        if out.device.type != "cpu" or not out.is_floating_point() or not out.is_contiguous():
            raise ValueError("out must be a contiguous floating-point CPU tensor")
        flat = out.view(-1)
        n = flat.numel()
        scale = float(std) / math.sqrt(terms)
        work = _NormalWork(min(n, NORMAL_CHUNK), terms)
        for start in range(0, n, NORMAL_CHUNK):
            m = min(NORMAL_CHUNK, n - start)
            acc = work.chunk(self, m)
            acc.mul_(scale)
            flat[start : start + m].copy_(acc)

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Key, stream id and position as tensors (safetensors-able). SECRET: the key
        regenerates every draw of the stream and of every stream derived from it."""
        return {
            "version": torch.tensor(STATE_VERSION, dtype=torch.int64),
            "key": torch.frombuffer(bytearray(self._key), dtype=torch.uint8).clone(),
            "stream_id": torch.tensor(self.stream_id, dtype=torch.int64),
            "position": torch.tensor(self.position, dtype=torch.int64),
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> SecureStream:
        try:
            version = int(state["version"])
            key = bytes(torch.as_tensor(state["key"], dtype=torch.uint8).tolist())
            stream_id, position = int(state["stream_id"]), int(state["position"])
        except KeyError as exc:
            raise ValueError(f"not a SecureStream state: missing {exc}") from exc
        if version != STATE_VERSION:
            raise ValueError(f"unsupported SecureStream state version {version}")
        return cls(key, stream_id=stream_id, position=position)

    def __repr__(self) -> str:  # never the key
        return f"SecureStream(stream_id={self.stream_id}, position={self.position})"


def check_terms(terms: int) -> int:
    """``terms`` (normals summed per draw) as a positive int, or ValueError."""
    if isinstance(terms, bool) or not isinstance(terms, int) or terms < 1:
        raise ValueError(f"terms must be a positive integer, got {terms!r}")
    return terms


def bernoulli_threshold(q: float) -> int:
    """⌊q · 2⁶⁴⌋ exactly (q as the float it is), in [0, 2⁶⁴]."""
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
        raise ValueError(f"q must be a number in [0, 1], got {q!r}")
    return math.floor(Fraction(q) * (1 << 64))


class _NormalWork:
    """Reusable buffers for one chunk of ``m`` outputs of ``terms`` terms each.

    Chunk layout in the stream: for each term k, h = ⌈m/2⌉ words for u₁ then h words for u₂;
    pair j gives r cos θ to output j and r sin θ to output j + h (dropped when j + h = m)."""

    def __init__(self, m: int, terms: int):
        self.terms = terms
        h = -(-m // 2)
        self.words = np.empty(2 * h * terms, dtype=np.uint64)
        self.uniforms = torch.empty(2 * h * terms, dtype=torch.float64)
        self.acc = torch.empty(2 * h, dtype=torch.float64)
        self.tmp = torch.empty(h, dtype=torch.float64)

    def chunk(self, stream: SecureStream, m: int) -> torch.Tensor:
        h = -(-m // 2)
        words = stream.words_into(self.words[: 2 * h * self.terms])
        uniforms = self.uniforms[: 2 * h * self.terms]
        # ⌊w / 2¹¹⌋: 53 bits, exact in float64
        np.right_shift(words, np.uint64(11), out=words)
        uniforms.copy_(torch.from_numpy(words.view(np.int64)))
        acc, tmp = self.acc[: 2 * h], self.tmp[:h]
        acc.zero_()
        for k in range(self.terms):
            u1 = uniforms[2 * h * k : 2 * h * k + h]
            u2 = uniforms[2 * h * k + h : 2 * h * (k + 1)]
            u1.add_(1.0).mul_(_U53)  # (0, 1]: log is finite
            u1.log_().mul_(-2.0).sqrt_()  # r = √(−2 ln u₁)
            u2.mul_(_U53 * _TWO_PI)  # θ = 2π u₂
            torch.cos(u2, out=tmp)
            acc[:h].addcmul_(u1, tmp)
            torch.sin(u2, out=tmp)
            acc[h:].addcmul_(u1, tmp)
        return acc[:m]
