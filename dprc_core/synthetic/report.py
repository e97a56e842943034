"""The data owner's quality and leakage report for a synthetic data set.

Each statistic compares the synthetic records with the owner's private records, so the report
is NOT differentially private: it is for the data owner only, never for publication.

* fidelity: can a classifier tell synthetic from held-out real records (``two_sample_auc``,
  0.5 = indistinguishable)? How far apart are the two embedding clouds (``frechet_distance``,
  the FID formula on sentence embeddings)? Do lengths and labels match (KS statistic,
  total-variation distance)?
* utility (classification): does a classifier trained on synthetic records do as well on real
  held-out records as one trained on real records (``train_on_synthetic``: TSTR vs TRTR)?
* leakage: does the synthetic set copy training records, verbatim (``exact_copies``), nearly
  (``near_copies``: cosine similarity of embeddings) or in part (the longest substring shared
  with any training record, found with a suffix automaton)?

Embeddings are mean-pooled MiniLM sentence embeddings (``embed``); the classifiers are
L2-regularised (multinomial) logistic regressions fitted with L-BFGS on float64 (no
scikit-learn).
"""

from __future__ import annotations

import bisect
import math
import unicodedata
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dprc_core.training.data import _joined

FORMATS = ("text", "classification", "chat")

NOTE = (
    "These statistics read the private training and held-out records: they are not "
    "differentially private and are for the data owner only (do not publish them)."
)


def record_text(record: dict[str, Any]) -> str:
    """A record's text for the report: ``text`` (text and classification lines) or, for a chat
    line, its messages as ``role: content`` lines joined with newlines."""
    if "messages" in record:
        return _joined(record["messages"])
    if "text" not in record:
        raise ValueError(f"record has neither 'text' nor 'messages': keys {sorted(record)}")
    return str(record["text"])


# --------------------------------------------------------------------------- embeddings


def embed(
    texts: Sequence[str], model_dir: str | Path, batch_size: int = 64, max_length: int = 128
) -> np.ndarray:
    """Sentence embeddings [n, d] (float64): the encoder's last hidden states averaged over
    the real tokens (attention-mask weighted), L2-normalised, so a dot product is a cosine
    similarity. Local model folder only, safetensors weights, no remote code, float32 eval."""
    import torch
    from transformers import AutoModel

    from dprc_core.training.models import check_model_dir, load_tokenizer

    folder = check_model_dir(model_dir)
    tokenizer = load_tokenizer(folder)
    model = AutoModel.from_pretrained(
        folder, use_safetensors=True, trust_remote_code=False, local_files_only=True
    )
    model = model.float().eval()
    out: list[np.ndarray] = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            batch = list(texts[start : start + batch_size])
            enc = tokenizer(
                batch, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
            )
            hidden = model(
                input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]
            ).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            out.append(pooled.double().numpy())
    if not out:
        return np.zeros((0, int(model.config.hidden_size)), dtype=np.float64)
    return np.concatenate(out, axis=0)


# --------------------------------------------------------------------------- classifiers


class _Logistic:
    """Multinomial logistic regression: sum of cross-entropies + ``l2``/2 ||W||² (intercepts
    not penalised; ``l2`` = 1 is scikit-learn's C = 1), on features standardised with the
    training rows' mean and std; fitted with scipy's L-BFGS on float64."""

    def __init__(self, l2: float = 1.0, max_iter: int = 500) -> None:
        self.l2 = l2
        self.max_iter = max_iter

    def fit(self, X: np.ndarray, y: np.ndarray, n_classes: int) -> _Logistic:
        from scipy.optimize import minimize

        X = np.asarray(X, dtype=np.float64)
        self.mean = X.mean(axis=0)
        std = X.std(axis=0)
        self.std = np.where(std > 1e-12, std, 1.0)
        Z = (X - self.mean) / self.std
        n, d = Z.shape
        K = n_classes
        Y = np.zeros((n, K))
        Y[np.arange(n), y] = 1.0

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            W = theta[: d * K].reshape(d, K)
            b = theta[d * K :]
            logits = Z @ W + b
            top = logits.max(axis=1, keepdims=True)
            lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
            loss = float((lse - (logits * Y).sum(axis=1)).sum()) + 0.5 * self.l2 * float(
                (W * W).sum()
            )
            P = np.exp(logits - lse[:, None])
            G = P - Y
            grad = np.concatenate([(Z.T @ G + self.l2 * W).ravel(), G.sum(axis=0)])
            # scaled by 1/n: same minimiser, better-conditioned for L-BFGS's tolerances
            return loss / n, grad / n

        theta0 = np.zeros(d * K + K)
        res = minimize(
            objective, theta0, jac=True, method="L-BFGS-B", options={"maxiter": self.max_iter}
        )
        self.W = res.x[: d * K].reshape(d, K)
        self.b = res.x[d * K :]
        return self

    def decision(self, X: np.ndarray) -> np.ndarray:
        Z = (np.asarray(X, dtype=np.float64) - self.mean) / self.std
        return Z @ self.W + self.b

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.decision(X).argmax(axis=1)


def mann_whitney_auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """ROC AUC = P(score of a positive > score of a negative), ties counted half: the
    Mann-Whitney U statistic of the positives over n_pos * n_neg (midranks handle ties)."""
    from scipy.stats import rankdata

    pos = np.asarray(positive, dtype=np.float64).ravel()
    neg = np.asarray(negative, dtype=np.float64).ravel()
    if len(pos) == 0 or len(neg) == 0:
        raise ValueError("the AUC needs at least one score on each side")
    ranks = rankdata(np.concatenate([pos, neg]))
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0
    return float(u / (len(pos) * len(neg)))


def _stratified_folds(y: np.ndarray, folds: int, rng: np.random.Generator) -> np.ndarray:
    """A fold number per row: each class shuffled and dealt round-robin into the folds."""
    fold_of = np.empty(len(y), dtype=np.int64)
    for cls in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == cls))
        fold_of[idx] = np.arange(len(idx)) % folds
    return fold_of


def two_sample_auc(real: np.ndarray, synthetic: np.ndarray, folds: int = 5, seed: int = 0) -> float:
    """Classifier two-sample test: a logistic regression learns to tell real from synthetic
    embeddings; its out-of-fold ROC AUC (stratified ``folds``-fold cross-validation, shuffled
    with ``seed``) is 0.5 when the two sets are indistinguishable and 1.0 when always told
    apart. ``folds`` is lowered to the smaller side's size; each side needs >= 2 rows
    (ValueError otherwise). Noise: with 200 rows per side and two identical laws the AUC
    spreads about ±0.04 around 0.5 (wider for smaller sets), so read values that close to 0.5
    as "indistinguishable"."""
    real = np.asarray(real, dtype=np.float64)
    synthetic = np.asarray(synthetic, dtype=np.float64)
    if real.ndim != 2 or synthetic.ndim != 2 or real.shape[1] != synthetic.shape[1]:
        raise ValueError(
            f"two_sample_auc needs two [n, d] arrays of one width, got {real.shape} "
            f"and {synthetic.shape}"
        )
    smallest = min(len(real), len(synthetic))
    if smallest < 2:
        raise ValueError(
            f"two_sample_auc needs at least 2 rows per side, got {len(real)} real "
            f"and {len(synthetic)} synthetic"
        )
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    k = min(folds, smallest)
    X = np.concatenate([real, synthetic], axis=0)
    y = np.concatenate([np.zeros(len(real), np.int64), np.ones(len(synthetic), np.int64)])
    fold_of = _stratified_folds(y, k, np.random.default_rng(seed))
    scores = np.empty(len(y))
    for f in range(k):
        test = fold_of == f
        model = _Logistic().fit(X[~test], y[~test], 2)
        logits = model.decision(X[test])
        scores[test] = logits[:, 1] - logits[:, 0]
    return mann_whitney_auc(scores[y == 1], scores[y == 0])


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two embedding sets (the FID formula):
    ||μa − μb||² + Tr(Σa + Σb − 2 (Σa Σb)^½), covariances with ddof = 1, the matrix square
    root's real part, clipped at 0. 0 for identical sets; grows with mean and spread gaps."""
    from scipy.linalg import sqrtm

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"frechet_distance needs two [n, d] arrays of one width, got {a.shape} and {b.shape}"
        )
    if len(a) < 2 or len(b) < 2:
        raise ValueError(
            f"frechet_distance needs at least 2 rows per side, got {len(a)} and {len(b)}"
        )
    diff = a.mean(axis=0) - b.mean(axis=0)
    cov_a = np.atleast_2d(np.cov(a, rowvar=False, ddof=1))
    cov_b = np.atleast_2d(np.cov(b, rowvar=False, ddof=1))
    covmean = sqrtm(cov_a @ cov_b)
    if not np.all(np.isfinite(covmean)):
        # singular product: the usual FID remedy, a small ridge on both covariances
        eye = np.eye(len(cov_a)) * 1e-6
        covmean = sqrtm((cov_a + eye) @ (cov_b + eye))
    covmean = np.real(covmean)
    value = float(diff @ diff + np.trace(cov_a) + np.trace(cov_b) - 2.0 * np.trace(covmean))
    return max(value, 0.0)


def _label_key(value: Any) -> tuple[str, str]:
    return (type(value).__name__, str(value))


def train_on_synthetic(
    synth_X: np.ndarray,
    synth_y: Sequence[Any],
    real_train_X: np.ndarray,
    real_train_y: Sequence[Any],
    test_X: np.ndarray,
    test_y: Sequence[Any],
    seed: int = 0,
) -> dict[str, Any]:
    """Utility of a synthetic classification set: a multinomial logistic regression on
    embeddings trained on synthetic records (TSTR) and, as the reference, on real training
    records (TRTR), both scored on the real held-out test split. ``majority_accuracy``: always
    predicting the test split's most frequent label. Labels (str or int) are matched by value;
    a label absent from a training set is never predicted by its model (counts as wrong); a
    training set with a single label predicts it everywhere. ``seed`` is accepted for a
    stable signature: the fit (L-BFGS from zeros) is deterministic."""
    del seed
    test_y = list(test_y)
    if len(test_y) == 0:
        raise ValueError("train_on_synthetic needs a non-empty test set")
    if len(synth_y) == 0:
        raise ValueError("train_on_synthetic needs a non-empty synthetic set")
    labels = sorted(
        {_label_key(v): v for v in [*synth_y, *real_train_y, *test_y]}.items(),
        key=lambda kv: kv[0],
    )
    index = {key: i for i, (key, _) in enumerate(labels)}
    test_idx = np.array([index[_label_key(v)] for v in test_y])

    def accuracy(X: np.ndarray, y: Sequence[Any]) -> float | None:
        if len(y) == 0:
            return None
        y_idx = np.array([index[_label_key(v)] for v in y])
        present = np.unique(y_idx)
        if len(present) == 1:
            pred = np.full(len(test_idx), present[0])
        else:
            local = np.searchsorted(present, y_idx)
            model = _Logistic().fit(np.asarray(X), local, len(present))
            pred = present[model.predict(np.asarray(test_X))]
        return float((pred == test_idx).mean())

    majority = Counter(test_idx.tolist()).most_common(1)[0][1] / len(test_idx)
    return {
        "tstr_accuracy": accuracy(synth_X, synth_y),
        "trtr_accuracy": accuracy(real_train_X, real_train_y),
        "majority_accuracy": float(majority),
        "n_test": len(test_idx),
    }


# --------------------------------------------------------------------------- leakage


def _normalised(text: str) -> str:
    """NFKC (compatibility forms: "ﬁ" → "fi", full-width → ASCII), casefold, whitespace runs
    collapsed to one space and stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def longest_shared_substring(
    synthetic_texts: Sequence[str], training_texts: Sequence[str]
) -> dict[str, Any]:
    """The longest run of characters that appears in some synthetic text and some training
    text: its length and the index of one synthetic and one training text holding it
    (indices None when nothing is shared).

    A suffix automaton over the training texts joined with sentinels distinct from every
    character and from each other (negative integers), so no path crosses two texts; each
    state keeps the end position of its first occurrence, which names the training text.
    Each synthetic text is then walked through it (the standard longest-common-substring
    scan). Linear in the total length of both sides: 5,000 x 5,000 texts of 100 characters
    take about a second and a few hundred MB (one Python dict of transitions per state)."""
    nxt: list[dict[Any, int]] = [{}]
    link = [-1]
    length = [0]
    first_end = [-1]
    starts: list[int] = []
    last = 0
    pos = 0

    def extend(ch: Any) -> None:
        nonlocal last
        cur = len(nxt)
        nxt.append({})
        length.append(length[last] + 1)
        link.append(-1)
        first_end.append(pos)
        p = last
        while p != -1 and ch not in nxt[p]:
            nxt[p][ch] = cur
            p = link[p]
        if p == -1:
            link[cur] = 0
        else:
            q = nxt[p][ch]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(nxt)
                nxt.append(dict(nxt[q]))
                length.append(length[p] + 1)
                link.append(link[q])
                first_end.append(first_end[q])
                while p != -1 and nxt[p].get(ch) == q:
                    nxt[p][ch] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        last = cur

    for i, text in enumerate(training_texts):
        starts.append(pos)
        for ch in text:
            extend(ch)
            pos += 1
        extend(-(i + 1))
        pos += 1

    best_len, best_synth, best_state = 0, -1, -1
    for s_idx, text in enumerate(synthetic_texts):
        state, cur_len = 0, 0
        for ch in text:
            while state and ch not in nxt[state]:
                state = link[state]
                cur_len = length[state]
            target = nxt[state].get(ch)
            if target is None:
                continue
            state = target
            cur_len += 1
            if cur_len > best_len:
                best_len, best_synth, best_state = cur_len, s_idx, state
    if best_len == 0:
        return {"length": 0, "synthetic_index": None, "training_index": None}
    training_index = bisect.bisect_right(starts, first_end[best_state]) - 1
    return {"length": best_len, "synthetic_index": best_synth, "training_index": training_index}


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def leakage(
    synthetic_texts: Sequence[str],
    training_texts: Sequence[str],
    synth_emb: np.ndarray | None = None,
    train_emb: np.ndarray | None = None,
    near_threshold: float = 0.95,
) -> dict[str, Any]:
    """How much of the training set the synthetic set reproduces.

    * ``exact_copies``: synthetic records whose text equals a training text after NFKC,
      casefolding and whitespace collapsing (trivial rewrites still count as copies);
    * ``near_copies``: synthetic records whose largest cosine similarity to a training
      embedding is >= ``near_threshold`` (paraphrase-level copies; None without embeddings),
      and ``max_similarity``, the largest such similarity;
    * ``longest_shared_substring``: the longest character run shared by a synthetic and a
      training text (a copied phrase, name or number shows up here even inside new text).
    """
    n = len(synthetic_texts)
    seen = {_normalised(t) for t in training_texts}
    exact = sum(1 for t in synthetic_texts if _normalised(t) in seen)
    near: int | None = None
    max_sim: float | None = None
    if synth_emb is not None and train_emb is not None and n and len(training_texts):
        s = _unit_rows(synth_emb)
        t = _unit_rows(train_emb)
        if len(s) != n or len(t) != len(training_texts):
            raise ValueError("leakage: one embedding row per text is needed on each side")
        best = np.concatenate([(s[i : i + 1024] @ t.T).max(axis=1) for i in range(0, n, 1024)])
        near = int((best >= near_threshold).sum())
        max_sim = float(best.max())
    return {
        "exact_copies": exact,
        "exact_copy_rate": exact / n if n else None,
        "near_copies": near,
        "near_copy_rate": near / n if near is not None and n else None,
        "max_similarity": max_sim,
        "near_threshold": near_threshold,
        "longest_shared_substring": longest_shared_substring(synthetic_texts, training_texts),
    }


# --------------------------------------------------------------------------- the report


def _length_stats(lengths: np.ndarray) -> dict[str, float]:
    q = np.quantile(lengths, [0.1, 0.5, 0.9])
    return {
        "mean": float(lengths.mean()),
        "std": float(lengths.std(ddof=1)) if len(lengths) > 1 else 0.0,
        "q10": float(q[0]),
        "q50": float(q[1]),
        "q90": float(q[2]),
    }


def _labels(records: Sequence[dict[str, Any]], side: str) -> list[Any]:
    out = []
    for i, r in enumerate(records):
        if "label" not in r:
            raise ValueError(f"{side} record {i} has no 'label' (format 'classification')")
        out.append(r["label"])
    return out


def _label_section(synth: list[Any], hold: list[Any]) -> dict[str, Any]:
    """Label frequencies per side (keyed by the label's text) and their total-variation
    distance, ½ Σ |p_synthetic − p_holdout| (0: same mix, 1: disjoint labels)."""
    cs = Counter(_label_key(v) for v in synth)
    ch = Counter(_label_key(v) for v in hold)
    keys = sorted(set(cs) | set(ch))
    ps = {k: cs[k] / len(synth) for k in keys}
    ph = {k: ch[k] / len(hold) for k in keys}
    return {
        "synthetic": {k[1]: ps[k] for k in keys if cs[k]},
        "holdout": {k[1]: ph[k] for k in keys if ch[k]},
        "total_variation": 0.5 * sum(abs(ps[k] - ph[k]) for k in keys),
    }


def _plain(value: Any) -> Any:
    """JSON-ready: numpy scalars to Python, NaN and infinities to None, recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer | int):
        return int(value)
    if isinstance(value, np.floating | float):
        return float(value) if math.isfinite(float(value)) else None
    return value


def quality_report(
    synthetic: Sequence[dict[str, Any]],
    real_train: Sequence[dict[str, Any]],
    real_holdout: Sequence[dict[str, Any]],
    fmt: str,
    model_dir: str | Path | None,
    seed: int = 0,
) -> dict[str, Any]:
    """The owner's report on a synthetic data set, JSON-ready (plain types, None for missing
    or undefined numbers). Fidelity compares synthetic with held-out records (records the
    generator never trained on); leakage compares synthetic with training records; utility
    (classification) trains on synthetic and tests on held-out records.

    Raises ValueError for an unknown ``fmt``, an empty synthetic or held-out set, or records
    lacking their format's fields. With fewer than 2 records on a side the two-sample AUC and
    the Fréchet distance are None and ``fidelity["embedding_reason"]`` says why; with
    ``model_dir`` None every embedding-based number is None (``embedding_model`` None).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    if len(synthetic) == 0:
        raise ValueError("the synthetic set is empty")
    if len(real_holdout) == 0:
        raise ValueError("the held-out set is empty: fidelity and utility need real records")
    synth_text = [record_text(r) for r in synthetic]
    train_text = [record_text(r) for r in real_train]
    hold_text = [record_text(r) for r in real_holdout]
    classification = fmt == "classification"
    if classification:
        synth_y = _labels(synthetic, "synthetic")
        train_y = _labels(real_train, "training")
        hold_y = _labels(real_holdout, "held-out")

    synth_len = np.array([len(t) for t in synth_text], dtype=np.float64)
    hold_len = np.array([len(t) for t in hold_text], dtype=np.float64)
    from scipy.stats import ks_2samp

    fidelity: dict[str, Any] = {
        "two_sample_auc": None,
        "frechet_distance": None,
        "embedding_reason": None,
        "length": {
            "synthetic": _length_stats(synth_len),
            "holdout": _length_stats(hold_len),
            "ks_statistic": float(ks_2samp(synth_len, hold_len).statistic),
        },
        "labels": _label_section(synth_y, hold_y) if classification else None,
    }
    utility: dict[str, Any] | None = None
    synth_emb = train_emb = None
    if model_dir is None:
        fidelity["embedding_reason"] = (
            "no embedding model: the two-sample AUC, the Fréchet distance, near copies and "
            "utility (classification) are skipped"
        )
    else:
        synth_emb = embed(synth_text, model_dir)
        hold_emb = embed(hold_text, model_dir)
        train_emb = embed(train_text, model_dir) if train_text else None
        if min(len(synth_emb), len(hold_emb)) < 2:
            fidelity["embedding_reason"] = (
                "the two-sample AUC and the Fréchet distance need at least 2 synthetic and "
                f"2 held-out records (got {len(synth_emb)} and {len(hold_emb)})"
            )
        else:
            fidelity["two_sample_auc"] = two_sample_auc(hold_emb, synth_emb, seed=seed)
            fidelity["frechet_distance"] = frechet_distance(synth_emb, hold_emb)
        if classification:
            utility = train_on_synthetic(
                synth_emb,
                synth_y,
                train_emb if train_emb is not None else np.zeros((0, synth_emb.shape[1])),
                train_y,
                hold_emb,
                hold_y,
                seed=seed,
            )
    report = {
        "private": True,
        "note": NOTE,
        "format": fmt,
        "embedding_model": Path(model_dir).name if model_dir is not None else None,
        "counts": {
            "synthetic": len(synthetic),
            "real_train": len(real_train),
            "holdout": len(real_holdout),
        },
        "fidelity": fidelity,
        "utility": utility,
        "leakage": leakage(synth_text, train_text, synth_emb, train_emb),
    }
    return _plain(report)
