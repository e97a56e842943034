"""Secure mode: ChaCha20 noise and Poisson masks (dprc_core.noise.secure_stream & co).

References are independent of the code under test: the RFC 8439 test vectors and a pure-Python
ChaCha20 written from the RFC; scipy's KS / Anderson–Darling / binomial tests; Python integers
for the exact Bernoulli; a textbook Box–Muller (numpy) for the floating-point attack.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from dprc_core import PrivacyEngine
from dprc_core.noise import SecureGaussianNoise, SecureStream
from dprc_core.noise.secure_stream import NORMAL_CHUNK, bernoulli_threshold, derive_key
from dprc_core.seeding import derive_seed
from dprc_core.training.secure_sampling import SecurePoissonSampler

RFC_KEY = bytes(range(32))


def _key(label: str) -> bytes:
    """A fixed key per statistical test: the tests are deterministic (no flaky p-values)."""
    return hashlib.sha256(label.encode()).digest()


# ------------------------------------------------------------------ the keystream is ChaCha20
def _rotl(x: int, n: int) -> int:
    return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF


def _chacha20_block(key: bytes, counter: int, nonce: bytes) -> bytes:
    """RFC 8439 §2.3, in plain Python (the independent reference)."""
    state = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    state += list(struct.unpack("<8I", key)) + [counter] + list(struct.unpack("<3I", nonce))
    x = list(state)

    def qr(a: int, b: int, c: int, d: int) -> None:
        x[a] = (x[a] + x[b]) & 0xFFFFFFFF
        x[d] = _rotl(x[d] ^ x[a], 16)
        x[c] = (x[c] + x[d]) & 0xFFFFFFFF
        x[b] = _rotl(x[b] ^ x[c], 12)
        x[a] = (x[a] + x[b]) & 0xFFFFFFFF
        x[d] = _rotl(x[d] ^ x[a], 8)
        x[c] = (x[c] + x[d]) & 0xFFFFFFFF
        x[b] = _rotl(x[b] ^ x[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12), qr(1, 5, 9, 13), qr(2, 6, 10, 14), qr(3, 7, 11, 15)
        qr(0, 5, 10, 15), qr(1, 6, 11, 12), qr(2, 7, 8, 13), qr(3, 4, 9, 14)
    return struct.pack("<16I", *((a + b) & 0xFFFFFFFF for a, b in zip(x, state)))


def _reference_words(key: bytes, stream_id: int, position: int, n: int) -> bytes:
    """Words [position, position + n) of the layout documented in secure_stream."""
    first, last = position // 8, (position + n - 1) // 8
    data = b"".join(
        _chacha20_block(
            key, b & 0xFFFFFFFF, (b >> 32).to_bytes(4, "little") + stream_id.to_bytes(8, "little")
        )
        for b in range(first, last + 1)
    )
    skip = 8 * (position - 8 * first)
    return data[skip : skip + 8 * n]


def test_rfc8439_block_function_vector():
    """RFC 8439 §2.3.2: key 00..1f, nonce 00000009 0000004a 00000000, block counter 1."""
    high = int.from_bytes(bytes.fromhex("00000009"), "little")
    stream_id = int.from_bytes(bytes.fromhex("0000004a00000000"), "little")
    stream = SecureStream(RFC_KEY, stream_id=stream_id, position=((high << 32) | 1) * 8)
    expected = (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    assert stream.words(8).tobytes().hex() == expected
    assert _chacha20_block(RFC_KEY, 1, bytes.fromhex("000000090000004a00000000")).hex() == expected


def test_rfc8439_encryption_vector():
    """RFC 8439 §2.4.2: the keystream from block 1 XOR the sunscreen text is the ciphertext."""
    plaintext = (
        b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for "
        b"the future, sunscreen would be it."
    )
    stream_id = int.from_bytes(bytes.fromhex("0000004a00000000"), "little")
    stream = SecureStream(RFC_KEY, stream_id=stream_id, position=8)
    keystream = stream.words(-(-len(plaintext) // 8)).tobytes()
    ciphertext = bytes(a ^ b for a, b in zip(plaintext, keystream))
    assert ciphertext.hex() == (
        "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
        "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
        "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
        "5af90bbf74a35be6b40b8eedf2785e42874d"
    )


@pytest.mark.parametrize(
    "stream_id, position, n",
    [
        (0, 0, 24),
        (7, 3, 21),  # unaligned start and end
        (2**63 - 1, 8 * (2**32 - 2) + 5, 30),  # across the 2^32-block counter boundary
        (123, 8 * (5 * 2**32 - 1), 16),
    ],
)
def test_stream_matches_the_pure_python_reference(stream_id, position, n):
    key = bytes(range(100, 132))
    stream = SecureStream(key, stream_id=stream_id, position=position)
    first = stream.words(n // 2).tobytes()
    second = stream.words(n - n // 2).tobytes()  # sequential draws continue the stream
    assert first + second == _reference_words(key, stream_id, position, n)
    assert stream.position == position + n


# ------------------------------------------------------------ keys, sub-streams, resume
def test_default_streams_are_seeded_from_the_os():
    a, b = SecureStream(), SecureStream()
    assert not np.array_equal(a.words(4), b.words(4))
    like = torch.zeros(1000)
    n1 = SecureGaussianNoise(1.0).sample(0, like)
    n2 = SecureGaussianNoise(1.0).sample(0, like)
    assert n1 is not None and n2 is not None and not torch.equal(n1, n2)


def test_state_dict_never_shows_the_key_in_repr():
    stream = SecureStream(RFC_KEY)
    assert RFC_KEY.hex() not in repr(stream) and "key" not in repr(stream)


def test_derived_keys_are_hmac_sha256_of_the_label():
    expected = hmac.new(RFC_KEY, b"dprc/secure-stream/v1/noise/3", hashlib.sha256).digest()
    assert derive_key(RFC_KEY, "noise", 3) == expected
    with pytest.raises(ValueError):
        derive_key(RFC_KEY, "a/b")


def test_sub_streams_are_independent():
    """Uniforms of sibling streams: correlation within 5/√n and a 16×16 χ² contingency test."""
    root = SecureStream(_key("independence"))
    n = 100_000
    streams = [root.derive("noise", 0), root.derive("noise", 1), root.derive("sampling")]
    streams += [streams[0].at(1)]
    draws = [s.uniform(n).numpy() for s in streams]
    for i in range(len(draws)):
        for j in range(i + 1, len(draws)):
            r = np.corrcoef(draws[i], draws[j])[0, 1]
            assert abs(r) < 5 / math.sqrt(n), (i, j, r)
            table = np.histogram2d(draws[i], draws[j], bins=16, range=[[0, 1], [0, 1]])[0]
            assert stats.chi2_contingency(table)[1] > 1e-4, (i, j)


def test_stream_resume_is_exact():
    stream = SecureStream()
    stream.words(13)
    stream.normal(1001)
    saved = {k: v.clone() for k, v in stream.state_dict().items()}
    expected = (stream.uniform(17), stream.normal(3001, terms=3), stream.bernoulli(999, 0.3))
    again = SecureStream.from_state_dict(saved)
    got = (again.uniform(17), again.normal(3001, terms=3), again.bernoulli(999, 0.3))
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    with pytest.raises(ValueError, match="missing"):
        SecureStream.from_state_dict({"key": saved["key"]})


# ------------------------------------------------------------------------ the distributions
def test_uniform_has_53_random_bits():
    n = 200_000
    stream = SecureStream(_key("uniform"))
    start = stream.position
    u = stream.uniform(n).numpy()
    words = SecureStream.from_state_dict(
        {**stream.state_dict(), "position": torch.tensor(start)}
    ).words(n)
    ints = (u * 2.0**53).astype(np.uint64)
    assert np.array_equal(ints.astype(np.float64) * 2.0**-53, u)  # multiples of 2^-53
    assert np.array_equal(ints, words >> np.uint64(11))  # the top 53 bits of each word
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    low = int((ints & np.uint64(1)).sum())  # the last of the 53 bits is a fair coin too
    assert stats.binomtest(low, n, 0.5).pvalue > 1e-4


@pytest.mark.parametrize("terms", [1, 2, 4])
def test_normal_follows_the_standard_normal_law(terms):
    n = 200_000
    z = SecureStream(_key(f"normal{terms}")).normal(n, terms=terms).numpy()
    assert z.dtype == np.float64
    assert stats.kstest(z, "norm").pvalue > 1e-4
    # Anderson–Darling against the fully specified N(0, 1), below its asymptotic 1% critical
    # value 3.857 (Stephens 1974, case 0)
    s = np.sort(z)
    i = np.arange(1, n + 1)
    a2 = -n - np.mean((2 * i - 1) * (stats.norm.logcdf(s) + stats.norm.logsf(s[::-1])))
    assert a2 < 3.857
    # moments: sd of the mean 1/√n, of the variance √(2/n), of the 4th moment √(96/n)
    assert abs(z.mean()) < 5 / math.sqrt(n)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / n)
    assert abs((z**4).mean() - 3) < 5 * math.sqrt(96 / n)
    # the tails: P(|Z| > 3) with a binomial bound
    tail = int((np.abs(z) > 3).sum())
    assert stats.binomtest(tail, n, 2 * stats.norm.sf(3)).pvalue > 1e-4


def test_normal_is_generated_in_float64_then_cast():
    key = bytes(32)
    wide = SecureStream(key).normal(70_001)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        out = torch.empty(70_001, dtype=dtype)
        SecureStream(key).normal_into(out, std=1.0)
        assert torch.equal(out, wide.to(dtype))
    scaled = torch.empty(70_001, dtype=torch.float64)
    SecureStream(key).normal_into(scaled, std=0.25)
    assert torch.equal(scaled, wide * 0.25)


@pytest.mark.parametrize("q", [0.013, 0.5, 1 / 3, 1e-3])
def test_bernoulli_rate_within_a_binomial_bound(q):
    n = 200_000
    hits = int(SecureStream(_key(f"bernoulli{q}")).bernoulli(n, q).sum())
    assert stats.binomtest(hits, n, q).pvalue > 1e-5


def test_bernoulli_is_an_exact_integer_comparison_never_above_q():
    for q in (0.1, 1 / 3, 0.013, 2.0**-70, 1 - 2.0**-53):
        t = bernoulli_threshold(q)
        assert t == math.floor(Fraction(q) * 2**64)  # Python's exact rationals
        assert Fraction(t, 2**64) <= Fraction(q) < Fraction(t + 1, 2**64)
    assert bernoulli_threshold(1.0) == 2**64 and bernoulli_threshold(0.0) == 0
    key = bytes(range(32))
    q = 0.3
    mask = SecureStream(key).bernoulli(5000, q)
    words = SecureStream(key).words(5000)
    expected = [int(w) < bernoulli_threshold(q) for w in words]  # big-int comparison
    assert mask.tolist() == expected
    assert bool(SecureStream().bernoulli(1000, 1.0).all())
    assert not bool(SecureStream().bernoulli(1000, 2.0**-70).any())
    with pytest.raises(ValueError):
        SecureStream().bernoulli(3, 1.5)


# ------------------------------------------------------------ the floating-point defence
def _attack_box_muller(z: np.ndarray, radius: float) -> tuple[int, int]:
    """Mironov-style membership test against Box–Muller from 53-bit uniforms.

    For the output pairs (z_j, z_{j+h}) of each chunk with radius r < ``radius`` (where the
    float grid is much finer than the image of the sampler), recover the uniforms — u₁ from r²,
    u₂ from the angle — try the integers around them, run the sampler forward and check whether
    it reproduces both floats to within 2 ulps. Returns (pairs tested, pairs reproduced). A
    sampler whose outputs are single Box–Muller values is reproduced almost always; for any
    other law it happens only when a candidate lands within 2 ulps by chance."""
    chunks = z.reshape(-1, NORMAL_CHUNK)
    h = NORMAL_CHUNK // 2
    z1, z2 = chunks[:, :h].ravel(), chunks[:, h:].ravel()
    r2 = z1 * z1 + z2 * z2
    keep = r2 < radius**2
    z1, z2, r2 = z1[keep], z2[keep], r2[keep]
    k1 = np.round(np.exp(-r2 / 2) * 2.0**53) - 1
    theta = np.mod(np.arctan2(z2, z1), 2 * np.pi)
    k2 = np.round(theta / (2 * np.pi) * 2.0**53)
    hit = np.zeros(len(z1), dtype=bool)
    for d1 in range(-2, 3):
        u1 = torch.from_numpy((k1 + d1 + 1) * 2.0**-53)
        r = u1.log().mul(-2.0).sqrt()
        for d2 in range(-4, 5):
            th = torch.from_numpy(k2 + d2).mul(2.0**-53 * 2 * math.pi)
            c1, c2 = (r * th.cos()).numpy(), (r * th.sin()).numpy()
            hit |= (np.abs(c1 - z1) <= 2 * np.spacing(np.abs(z1))) & (
                np.abs(c2 - z2) <= 2 * np.spacing(np.abs(z2))
            )
    return len(z1), int(hit.sum())


def _textbook_box_muller(n: int, seed: int) -> np.ndarray:
    """A naive float64 sampler: one Box–Muller value per output, laid out like the chunks."""
    rng = np.random.default_rng(seed)
    h = NORMAL_CHUNK // 2
    out = []
    for _ in range(n // NORMAL_CHUNK):
        k = rng.integers(0, 2**53, size=(2, h), dtype=np.uint64).astype(np.float64)
        r = np.sqrt(-2 * np.log((k[0] + 1) * 2.0**-53))
        theta = k[1] * (2.0**-53 * 2 * np.pi)
        out += [r * np.cos(theta), r * np.sin(theta)]
    return np.concatenate(out)


def test_the_sum_of_normals_defeats_the_floating_point_attack():
    """The output of a single-sample sampler reveals its uniforms; ours does not.

    The attack of ``_attack_box_muller`` reproduces ≥ 95% of small-radius outputs of a
    textbook Box–Muller and of our own code with ``terms=1`` (no defence) — the float value
    determines the two 53-bit uniforms, so whoever sees noise + value can test which value
    was noised (Mironov 2012 for Laplace; Jin et al. 2022 for the Gaussian and DP-SGD). With
    the sum of ``terms ≥ 2`` normals it reproduces (almost) none: one float, 2·terms unknowns."""
    n = 64 * NORMAL_CHUNK  # 2.1M outputs; ~500 pairs with r < 2^-5 per sampler
    radius = 2.0**-5
    tested, hits = _attack_box_muller(_textbook_box_muller(n, seed=1), radius)
    assert tested > 200 and hits >= 0.95 * tested, (tested, hits)
    key = bytes(range(32))
    tested, hits = _attack_box_muller(SecureStream(key).normal(n, terms=1).numpy(), radius)
    assert tested > 200 and hits >= 0.95 * tested, (tested, hits)
    for terms in (2, 4):
        tested, hits = _attack_box_muller(SecureStream(key).normal(n, terms=terms).numpy(), radius)
        assert tested > 200 and hits <= 0.05 * tested, (terms, tested, hits)


# --------------------------------------------------------------- SecureGaussianNoise
SHAPES = [(300, 7), (5,), (2, 3, 4), (NORMAL_CHUNK + 3,)]
DTYPES = [torch.float32, torch.float64, torch.float32, torch.bfloat16]


def _params() -> list[torch.Tensor]:
    return [torch.zeros(s, dtype=d) for s, d in zip(SHAPES, DTYPES)]


def _run(noise: SecureGaussianNoise, steps: int) -> list[list[torch.Tensor]]:
    out = []
    for _ in range(steps):
        drawn = []
        for i, p in enumerate(_params()):
            z = noise.sample(i, p, torch.Generator())
            assert z is not None and z.shape == p.shape and z.dtype == p.dtype
            drawn.append(z)
        noise.end_step()
        out.append(drawn)
    return out


def test_secure_noise_has_the_requested_std():
    stream = SecureStream(_key("std"))
    z = SecureGaussianNoise(2.5, stream=stream).sample(0, torch.zeros(200_000, dtype=torch.float64))
    assert z is not None
    assert stats.kstest(z.numpy() / 2.5, "norm").pvalue > 1e-4
    assert SecureGaussianNoise(0.0).sample(0, torch.zeros(3)) is None


def test_prefetch_is_bit_identical_to_synchronous_generation():
    stream = SecureStream(bytes(range(32)))
    sync = _run(SecureGaussianNoise(1.5, stream=stream), 3)
    with SecureGaussianNoise(1.5, stream=stream, prefetch=True) as ahead:
        learnt = _run(ahead, 3)  # learns the parameters in step 0, prefetches 1 and 2
        assert ahead.prefetch_misses == 0
    with SecureGaussianNoise(1.5, stream=stream, prefetch=True) as declared:
        declared.expect(_params())  # prefetches from step 0
        early = _run(declared, 3)
        assert declared.prefetch_misses == 0
    for got in (learnt, early):
        for a, b in zip(sync, got):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
    # the draws of different steps and parameters are different
    assert not torch.equal(sync[0][0], sync[1][0])


def test_prefetch_survives_a_changed_parameter_and_counts_the_miss():
    stream = SecureStream(bytes(range(32)))
    with SecureGaussianNoise(1.0, stream=stream, prefetch=True) as noise:
        noise.expect([torch.zeros(10)])
        z = noise.sample(0, torch.zeros(11))
        assert noise.prefetch_misses == 1
    assert z is not None
    assert torch.equal(z, SecureGaussianNoise(1.0, stream=stream).sample(0, torch.zeros(11)))


def test_secure_noise_resume_is_exact_with_prefetch():
    """The state saved between steps (with step t+1 already prefetched) continues exactly."""
    stream = SecureStream()
    straight = _run(SecureGaussianNoise(1.0, stream=stream), 4)
    with SecureGaussianNoise(1.0, stream=stream, prefetch=True) as first:
        _run(first, 2)
        state = {k: v.clone() for k, v in first.state_dict().items()}
    with SecureGaussianNoise(1.0, prefetch=True) as resumed:  # another (OS) key until loaded
        resumed.load_state_dict(state)
        rest = _run(resumed, 2)
    for a, b in zip(straight[2:], rest):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="std"):
        SecureGaussianNoise(2.0).load_state_dict(state)


def test_secure_noise_refuses_a_state_mid_step_and_double_sampling():
    noise = SecureGaussianNoise(1.0)
    noise.sample(0, torch.zeros(3))
    with pytest.raises(RuntimeError, match="twice"):
        noise.sample(0, torch.zeros(3))
    with pytest.raises(RuntimeError, match="middle"):
        noise.state_dict()


def test_ranks_draw_independent_shards_from_one_key():
    stream = SecureStream(_key("ranks"))
    a = SecureGaussianNoise(1.0, stream=stream, rank=0).sample(0, torch.zeros(100_000))
    b = SecureGaussianNoise(1.0, stream=stream, rank=1).sample(0, torch.zeros(100_000))
    assert a is not None and b is not None
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 5 / math.sqrt(100_000)


def test_close_stops_the_thread():
    noise = SecureGaussianNoise(1.0, prefetch=True)
    noise.expect([torch.zeros(1000)])
    noise.close()
    assert noise._executor is None and not noise.prefetch
    assert noise.sample(0, torch.zeros(1000)) is not None  # still usable, synchronously
    noise.end_step()
    assert noise._executor is None
    noise.close()  # idempotent


# ---------------------------------------- the noise is no longer a function of the torch seed
D = 20_000


def _noise_only_update(seed: int, secure: bool) -> torch.Tensor:
    """The engine's update when every gradient is zero (SGD, lr 1, B 1): minus the noise."""
    model = nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(
            model,
            opt,
            max_grad_norm=1.0,
            noise_multiplier=1.0,
            expected_batch_size=1.0,
            norm_method="exact",
            seed=seed,
            check_independence=False,
            secure_rng=secure,
        )
    engine.step()  # an empty logical batch: the update is the noise alone
    return -model.weight.detach()[0].clone()


def _attacker_prediction(seed: int) -> torch.Tensor:
    """What whoever knows the engine's seed predicts: the engine's torch generator's draw."""
    gen = torch.Generator().manual_seed(derive_seed(seed, "engine", 0))
    return torch.randn((1, D), generator=gen)[0]


def test_the_torch_seed_predicts_todays_noise_but_not_the_secure_noise():
    """Today's noise is a function of a 63-bit torch seed: knowing it (or the generator's
    state) reproduces the update exactly. The secure noise ignores torch's generators; it is
    uncorrelated with the prediction and differs between two runs with the same seed."""
    seed = 4321
    torch_noise = _noise_only_update(seed, secure=False)
    assert torch.equal(torch_noise, _attacker_prediction(seed))  # the attack on today's code
    secure = _noise_only_update(seed, secure=True)
    again = _noise_only_update(seed, secure=True)
    assert secure.std() == pytest.approx(1.0, rel=0.05)  # it is the noise, σ·C/B = 1
    prediction = _attacker_prediction(seed)
    corr = float(torch.corrcoef(torch.stack([secure, prediction]))[0, 1])
    assert abs(corr) < 5 / math.sqrt(D)
    assert not torch.equal(secure, again)


# -------------------------------------------------------------- SecurePoissonSampler
def test_secure_poisson_sampler_rate_and_interface():
    n, q, steps = 5000, 0.02, 40
    sampler = SecurePoissonSampler(n, q, steps, stream=SecureStream(_key("poisson")))
    assert len(sampler) == steps and sampler.expected_batch_size == pytest.approx(q * n)
    batches = list(sampler)
    assert len(batches) == steps and list(sampler) == []  # iteration resumes from .step
    sizes = [int(b.numel()) for b in batches]
    assert stats.binomtest(sum(sizes), n * steps, q).pvalue > 1e-5
    for b in batches:
        assert b.dtype == torch.int64 and bool((b[1:] > b[:-1]).all())
        assert b.numel() == 0 or (int(b.min()) >= 0 and int(b.max()) < n)
    # every example is included independently: per-example counts are Binomial(steps, q)
    counts = torch.bincount(torch.cat(batches), minlength=n).numpy()
    assert abs(counts.mean() - steps * q) < 5 * math.sqrt(steps * q * (1 - q) / n)


def test_secure_poisson_sampler_resume_and_shared_key():
    stream = SecureStream()
    full = list(SecurePoissonSampler(300, 0.1, 10, stream=stream))
    other_rank = list(SecurePoissonSampler(300, 0.1, 10, stream=stream))
    assert all(torch.equal(a, b) for a, b in zip(full, other_rank))  # one key, same batches
    part = SecurePoissonSampler(300, 0.1, 10, stream=stream)
    it = iter(part)
    for _ in range(4):
        next(it)
    state = {k: v.clone() for k, v in part.state_dict().items()}
    resumed = SecurePoissonSampler(300, 0.1, 10)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(full[4:], resumed))
    with pytest.raises(ValueError, match="sample_rate"):
        SecurePoissonSampler(300, 0.2, 10).load_state_dict(state)
    with pytest.raises(ValueError):
        SecurePoissonSampler(0, 0.1, 10)
    with pytest.raises(ValueError):
        SecurePoissonSampler(10, 0.0, 10)
