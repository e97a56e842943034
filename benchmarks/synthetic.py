"""DP synthetic data on a tiny Llama: does a classifier trained on the records learn the task,
and how far are the records from real ones, at ε = 1, 4, 8 and non-private (issue 44,
"Evidence").

Task (generated here, no download): short templated review lines with 3 labels of unequal
frequency (``good`` 50 %, ``bad`` 30 %, ``odd`` 20 %). Each label has its own adjectives; the
nouns, adverbs and templates are shared by all labels, and in a quarter of the lines one of the
two adjectives comes from another label, so a line can be ambiguous. ``N_TRAIN`` lines are the
private training file, ``N_TEST`` other lines the held-out real split.

Generator: ``build_tiny_llama`` (byte-level tokenizer, hidden 64, 2 layers, random
initialisation from the seed; no pretraining), full fine-tuning. DP rows:
``dprc_core.synthetic.pipeline.make_synthetic`` (exact norms, the label histogram released with
10 % of ε, the fine-tuning's σ calibrated so that both compose to ≤ ε at the default δ). The
non-private row: the same rendered prompt-completion file (``write_conditioned_file``),
tokenized by ``dprc_core.training.data``, a plain torch loop with Adam over shuffled batches of
batch 64 and learning rate 0.003 (the DP rows: batch 128, learning rate 0.01), the same
epochs, the mean token loss, no clipping, no noise;
its records drawn by ``synthesize`` with the training file's true label frequencies. Sampling:
temperature 1, top_p 1 for every row. Each seed fixes the model's initialisation, the job's
draws and the generation's.

Metrics, on bag-of-words features (word counts; whitespace-split words):

* train-on-synthetic accuracy: multinomial logistic regression (torch, float64, L-BFGS, L2
  ``L2``) trained on the synthetic records (vocabulary from them only), accuracy on the held-out
  real split; against the same classifier trained on the real training file (train-on-real) and
  the held-out majority-class rate;
* two-sample AUC: logistic regression separating synthetic records from held-out real records
  (as many of each), 5-fold cross-validated, the out-of-fold scores' AUC (Mann-Whitney); 0.5:
  the classifier cannot tell them apart.

Usage::

    .venv/bin/python benchmarks/synthetic.py            # writes docs/benchmarks/synthetic.md
    .venv/bin/python benchmarks/synthetic.py --quick    # 1 seed, ε = 8, prints only
    python benchmarks/synthetic.py --device cuda --quick   # the GPU check's step
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _bootstrap  # noqa: F401  (benchmarks/_bootstrap.py: the checkout first on the path)
import torch

from benchmarks.kit.pages import PAGES, cpu_model, git_commit, write_page  # noqa: E402

OUT = PAGES / "synthetic.md"
DATA_SEED = 4242
N_TRAIN, N_TEST, N_SYNTH = 2000, 600, 600
HIDDEN, LAYERS, MAX_SEQ_LEN = 64, 2, 64
EPOCHS, BATCH, LR = 20.0, 64, 0.003
# the DP rows' batch and learning rate: DP-SGD's recipe (docs/training.md, "Recipes") — a larger
# expected batch divides the noise of each update (σ·C/B), at the cost of fewer steps
DP_BATCH, DP_LR = 128, 0.01
GEN_BATCH, MAX_NEW = 64, 48
EPSILONS = (1.0, 4.0, 8.0)
LABEL_SHARE = 0.1
L2 = 1e-3
NP = "non-private"

# ------------------------------------------------------------------------------------- data
LABELS = {"good": 0.5, "bad": 0.3, "odd": 0.2}
ADJECTIVES = {
    "good": ["great", "lovely", "superb", "fine", "warm", "neat"],
    "bad": ["awful", "dull", "broken", "cold", "sad", "poor"],
    "odd": ["weird", "strange", "quirky", "eerie", "curious", "wild"],
}
NOUNS = ["movie", "meal", "trip", "game", "show", "book", "room", "song", "hotel", "class"]
ADVERBS = ["very", "really", "quite", "so", "rather"]
TEMPLATES = [
    "the {noun} was {adv} {a1}",
    "a {a1} {noun}, {adv} {a2}",
    "i found the {noun} {a1} and {a2}",
]
MIX_RATE = 0.25  # lines where one adjective comes from another label


def make_line(rng: random.Random) -> dict[str, str]:
    label = rng.choices(list(LABELS), weights=list(LABELS.values()))[0]
    a1, a2 = rng.sample(ADJECTIVES[label], 2)
    if rng.random() < MIX_RATE:
        other = rng.choice([x for x in LABELS if x != label])
        if rng.random() < 0.5:
            a1 = rng.choice(ADJECTIVES[other])
        else:
            a2 = rng.choice(ADJECTIVES[other])
    text = rng.choice(TEMPLATES).format(
        noun=rng.choice(NOUNS), adv=rng.choice(ADVERBS), a1=a1, a2=a2
    )
    return {"text": text, "label": label}


def write_data(folder: Path, n_train: int, n_test: int) -> tuple[Path, list[dict[str, str]]]:
    rng = random.Random(DATA_SEED)
    lines = [make_line(rng) for _ in range(n_train + n_test)]
    train = folder / "train.jsonl"
    train.write_text("".join(json.dumps(x) + "\n" for x in lines[:n_train]))
    return train, lines[n_train:]


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------------------ classifiers
def words(text: str) -> list[str]:
    return text.lower().replace(",", " ").split()


def vocabulary(texts: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for t in texts:
        for w in words(t):
            vocab.setdefault(w, len(vocab))
    return vocab


def features(texts: list[str], vocab: dict[str, int]) -> torch.Tensor:
    x = torch.zeros(len(texts), len(vocab) + 1, dtype=torch.float64)
    x[:, -1] = 1.0  # bias column
    for i, t in enumerate(texts):
        for w in words(t):
            j = vocab.get(w)
            if j is not None:
                x[i, j] += 1.0
    return x


def fit_logreg(x: torch.Tensor, y: torch.Tensor, classes: int) -> torch.Tensor:
    """Multinomial logistic regression: mean cross-entropy + L2·|W|² (bias included), L-BFGS."""
    w = torch.zeros(x.shape[1], classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w, y) + L2 * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach()


def class_accuracy(train: list[dict[str, Any]], test: list[dict[str, Any]]) -> float:
    """Train a bag-of-words classifier on ``train``, its accuracy on ``test``."""
    classes = list(LABELS)
    index = {c: i for i, c in enumerate(classes)}
    kept = [r for r in train if str(r["label"]) in index]
    vocab = vocabulary([r["text"] for r in kept])
    x = features([r["text"] for r in kept], vocab)
    y = torch.tensor([index[str(r["label"])] for r in kept])
    w = fit_logreg(x, y, len(classes))
    xt = features([r["text"] for r in test], vocab)
    yt = torch.tensor([index[r["label"]] for r in test])
    return float(((xt @ w).argmax(1) == yt).double().mean())


def mann_whitney_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie)."""
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    sorted_scores = scores[order]
    i, n = 0, len(scores)
    while i < n:  # average ranks over ties
        j = i
        while j + 1 < n and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    n_pos = int(positive.sum())
    n_neg = n - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def two_sample_auc(synth: list[str], real: list[str], seed: int, folds: int = 5) -> float:
    m = min(len(synth), len(real))
    texts = synth[:m] + real[:m]
    y = torch.tensor([1] * m + [0] * m)
    perm = torch.randperm(2 * m, generator=torch.Generator().manual_seed(seed))
    scores = torch.zeros(2 * m, dtype=torch.float64)
    for f in range(folds):
        test_idx = perm[f::folds]
        mask = torch.ones(2 * m, dtype=torch.bool)
        mask[test_idx] = False
        train_idx = mask.nonzero().squeeze(1)
        vocab = vocabulary([texts[i] for i in train_idx.tolist()])
        w = fit_logreg(features([texts[i] for i in train_idx.tolist()], vocab), y[train_idx], 2)
        logits = features([texts[i] for i in test_idx.tolist()], vocab) @ w
        scores[test_idx] = logits[:, 1] - logits[:, 0]
    return mann_whitney_auc(scores, y.bool())


# ---------------------------------------------------------------------------------- runs
class GenerationTimer:
    """Times ``synthesize`` (as the pipeline calls it) and counts the tokens ``generate`` returns
    (generated tokens, end token excluded, dropped attempts included)."""

    def __init__(self) -> None:
        import dprc_core.synthetic.generate as gen_mod
        import dprc_core.synthetic.pipeline as pipe_mod

        self.seconds = 0.0
        self.tokens = 0
        inner_generate, inner_synth = gen_mod.generate, gen_mod.synthesize

        def counting_generate(*args: Any, **kwargs: Any) -> list[list[int]]:
            out = inner_generate(*args, **kwargs)
            self.tokens += sum(len(x) for x in out)
            return out

        def timed_synthesize(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner_synth(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        gen_mod.generate = counting_generate
        pipe_mod.synthesize = timed_synthesize
        self.synthesize = timed_synthesize

    def reset(self) -> None:
        self.seconds, self.tokens = 0.0, 0


def model_path(folder: Path, seed: int) -> Path:
    from dprc_core.training.tiny import build_tiny_llama

    return build_tiny_llama(
        folder / f"llama-s{seed}",
        hidden=HIDDEN,
        layers=LAYERS,
        max_positions=128,
        seed=seed,
        tokenizer="byte",
    )


def train_settings(
    folder: Path, train: Path, seed: int, device: str, epochs: float
) -> dict[str, Any]:
    return dict(
        model=str(model_path(folder, seed)),
        train_file=str(train),
        epochs=epochs,
        batch_size=DP_BATCH,
        learning_rate=DP_LR,
        norm_method="exact",
        max_seq_len=MAX_SEQ_LEN,
        max_physical_batch_size=64,
        token_store=str(folder / "stores"),
        device=device,
        report_train_loss=False,
    )


def sampling() -> Any:
    from dprc_core.generation import SamplingSettings

    return SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW)


def run_dp(
    folder: Path,
    train: Path,
    seed: int,
    epsilon: float,
    n: int,
    device: str,
    epochs: float,
    timer: GenerationTimer,
) -> dict[str, Any]:
    from dprc_core.synthetic.pipeline import make_synthetic

    t0 = time.perf_counter()
    timer.reset()
    res = make_synthetic(
        train_settings(folder, train, seed, device, epochs),
        folder / f"dp-e{epsilon:g}-s{seed}",
        n,
        epsilon=epsilon,
        label_epsilon_share=LABEL_SHARE,
        sampling=sampling(),
        seed=seed,
        batch_size=GEN_BATCH,
    )
    prov = res.provenance
    return {
        "records": read_lines(res.records),
        "sigma": prov["fine_tuning"]["noise_multiplier"],
        "sigma_h": prov["label_histogram"]["noise_multiplier"],
        "epsilon": prov["epsilon"],
        "delta": prov["delta"],
        "steps": prov["fine_tuning"]["steps"],
        "gen_s": timer.seconds,
        "gen_tokens": timer.tokens,
        "seconds": time.perf_counter() - t0,
    }


def run_nonprivate(
    folder: Path,
    train: Path,
    seed: int,
    n: int,
    device: str,
    epochs: float,
    timer: GenerationTimer,
) -> dict[str, Any]:
    from dprc_core.synthetic.generate import SynthesisSpec
    from dprc_core.synthetic.records import write_conditioned_file
    from dprc_core.training.data import load_jsonl, tokenize
    from dprc_core.training.models import load_model, load_tokenizer

    t0 = time.perf_counter()
    timer.reset()
    out = folder / f"np-s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    rendered = out / "train.prompt_completion.jsonl"
    labels = write_conditioned_file(train, rendered)
    mp = model_path(folder, seed)
    tokenizer = load_tokenizer(mp)
    data = tokenize(load_jsonl(rendered, "causal_lm"), tokenizer, MAX_SEQ_LEN)
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    torch.manual_seed(seed)
    model = load_model(mp, "causal_lm").to(dev)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(seed)
    steps = round(epochs * len(data) / BATCH)
    perm = torch.randperm(len(data), generator=g)
    pos = 0
    for _ in range(steps):
        if pos + BATCH > len(data):
            perm, pos = torch.randperm(len(data), generator=g), 0
        batch = {k: v.to(dev) for k, v in data.batch(perm[pos : pos + BATCH]).items()}
        pos += BATCH
        opt.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        opt.step()
    counts = Counter(str(x) for x in labels)
    classes = tuple(sorted(counts))
    spec = SynthesisSpec(
        "classification",
        n,
        sampling(),
        seed=seed,
        batch_size=GEN_BATCH,
        labels=classes,
        label_probs=tuple(counts[c] / len(labels) for c in classes),
    )
    records = out / "synthetic.jsonl"
    timer.synthesize(model, tokenizer, spec, records)
    return {
        "records": read_lines(records),
        "steps": steps,
        "gen_s": timer.seconds,
        "gen_tokens": timer.tokens,
        "seconds": time.perf_counter() - t0,
    }


def printable(text: str) -> str:
    """``text`` with its non-printable characters (control bytes, newlines) shown as ``·``."""
    return "".join(c if c.isprintable() else "·" for c in text)


def score(run: dict[str, Any], test: list[dict[str, str]], seed: int) -> None:
    recs = run["records"]
    run["tos"] = class_accuracy(recs, test)
    run["auc"] = two_sample_auc([r["text"] for r in recs], [r["text"] for r in test], seed)
    run["records_per_s"] = len(recs) / run["gen_s"]
    run["tokens_per_s"] = run["gen_tokens"] / run["gen_s"]
    run["examples"] = [f"{r['label']}: {printable(r['text'])}" for r in recs[:3]]
    del run["records"]


# --------------------------------------------------------------------------------- report
def mean_se(xs: list[float]) -> tuple[float, float]:
    m = statistics.fmean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def pm(xs: list[float], scale: float = 1.0, digits: int = 1) -> str:
    m, se = mean_se([x * scale for x in xs])
    return f"{m:.{digits}f} ± {se:.{digits}f}" if len(xs) > 1 else f"{m:.{digits}f}"


def table(rows: dict[str, list[dict[str, Any]]], tor: float, majority: float) -> list[str]:
    out = [
        "| setting | σ fine-tuning | σ label histogram | ε composed (δ) | "
        "train-on-synthetic acc. (%) | two-sample AUC | train-on-real acc. (%) | "
        "majority (%) | records/s | tokens/s | s / run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rs in rows.items():
        dp = name != NP
        sigma = f"{rs[0]['sigma']:.3f}" if dp else "0"
        sigma_h = f"{rs[0]['sigma_h']:.2f}" if dp else "— (true counts)"
        eps = f"{max(r['epsilon'] for r in rs):.3f} ({rs[0]['delta']:.2g})" if dp else "∞"
        out.append(
            f"| {name} | {sigma} | {sigma_h} | {eps} | {pm([r['tos'] for r in rs], 100)} | "
            f"{pm([r['auc'] for r in rs], 1, 3)} | {100 * tor:.1f} | {100 * majority:.1f} | "
            f"{statistics.fmean(r['records_per_s'] for r in rs):.0f} | "
            f"{statistics.fmean(r['tokens_per_s'] for r in rs):.0f} | "
            f"{statistics.fmean(r['seconds'] for r in rs):.0f} |"
        )
    return out


def load_note() -> str:
    try:
        return "load average (1, 5, 15 min) at the end: " + ", ".join(
            f"{x:.2f}" for x in os.getloadavg()
        )
    except OSError:
        return "load average: unknown"


def page(
    rows: dict[str, list[dict[str, Any]]],
    tor: float,
    majority: float,
    seeds: list[int],
    argv: str,
    wall: float,
    sizes: tuple[int, int, int],
    epochs: float,
) -> str:
    n_train, n_test, n_synth = sizes
    tos_np = mean_se([r["tos"] for r in rows[NP]])[0]
    auc_np = mean_se([r["auc"] for r in rows[NP]])[0]
    reading = []
    for name, rs in rows.items():
        if name == NP:
            continue
        tos, auc = mean_se([r["tos"] for r in rs])[0], mean_se([r["auc"] for r in rs])[0]
        reading.append(
            f"* **{name}**: train-on-synthetic {100 * tos:.1f} % "
            f"({100 * (tos - tos_np):+.1f} points from non-private, "
            f"{100 * (tos - majority):+.1f} from the majority rate), two-sample AUC {auc:.3f} "
            f"({auc - auc_np:+.3f} from non-private)."
        )
    examples = "\n".join(
        f"    {name}: " + " | ".join(rs[0]["examples"]) for name, rs in rows.items()
    )
    omp = os.environ.get("OMP_NUM_THREADS", "unset")
    shown_templates = [f"`{t}`" for t in TEMPLATES]
    templates = ", ".join(shown_templates[:2]) + ",\n" + shown_templates[2]
    freqs = ", ".join(f"{k} {100 * v:.0f} %" for k, v in LABELS.items())
    return f"""# Synthetic data: train-on-synthetic accuracy and two-sample AUC (issue 44)

Produced by `{argv}` in {wall / 60:.1f} min, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.
Machine: {cpu_model()}, {os.cpu_count()} cores, `OMP_NUM_THREADS={omp}`,
torch {torch.get_num_threads()} thread(s); {load_note()}. Python {platform.python_version()},
torch {torch.__version__}; commit {git_commit()}.

## Task

{n_train} private training lines and {n_test} held-out real lines, generated by the script (seed
{DATA_SEED}): templated review lines ({templates}) with 3 labels of frequency {freqs}.
Each label has 6 adjectives of its own; the 10 nouns, 5 adverbs and 3 templates are shared; in
{100 * MIX_RATE:.0f} % of the lines one of the two adjectives comes from another label. The
generator is a tiny Llama built locally (`build_tiny_llama`: byte-level tokenizer, hidden
{HIDDEN}, {LAYERS} layers, random initialisation from the seed, no pretraining), fully
fine-tuned on the lines rendered as `label: <label>\\n` + text, then {n_synth} records drawn per
run (temperature 1, top_p 1, at most {MAX_NEW} new tokens, batches of {GEN_BATCH}).

* DP rows: `make_synthetic` (exact norms, clipping 1, {epochs:g} epochs, expected batch
  {DP_BATCH}, Adam, learning rate {DP_LR}); the label histogram is released with
  {100 * LABEL_SHARE:.0f} % of ε; the fine-tuning's σ is calibrated so that the histogram and
  the training compose to ≤ ε at the default δ = 1/N^1.1. "ε composed" is the provenance's
  (recomputed from the events that ran).
* Non-private row: the same rendered file and tokenization, a plain torch loop (Adam, learning
  rate {LR}, batch {BATCH}, the same epochs, shuffled batches, the mean token loss, no clipping,
  no noise); records drawn by `synthesize` with the training file's true label frequencies.
* Tuning, on the non-private row only (seed 0, batch 64; train-on-synthetic accuracy / AUC):
  (epochs, learning rate) = (4, 0.01): 55.7 % / 1.000; (10, 0.01): 62.8 % / 0.908;
  (20, 0.01): 65.0 % / 0.731; (40, 0.01): 68.5 % / 0.981; (10, 0.003): 87.5 % / 0.663;
  (20, 0.003): 87.8 % / 0.587, the setting kept. The DP rows' batch and learning rate were
  then chosen on seed 0 at ε = 8 (`--quick --full --eps 8`, 20 epochs; train-on-synthetic
  accuracy): (batch, learning rate) = (64, 0.003): 56.3 % (the non-private setting, the
  first version of this page); (64, 0.01): 52.8 %; (128, 0.005): 62.3 %; (128, 0.01): 72.2 %,
  kept; (256, 0.01): 67.7 %; (256, 0.02): 65.3 %; (512, 0.02, 40 epochs): 54.2 %. The same
  setting is used at every ε (not tuned per ε); seed 0 is one of the three reported seeds.

Metrics (computed by this script, not by `dprc_core/synthetic/report.py`): a bag-of-words
(word counts) multinomial logistic regression (float64, L-BFGS, L2 {L2:g}). Train-on-synthetic:
trained on the synthetic records (vocabulary from them only), accuracy on the held-out real
lines; train-on-real: the same classifier trained on the real training lines; majority: the
held-out rate of the most frequent label. Two-sample AUC: the same classifier separating
{n_synth} synthetic records from the held-out real lines (as many of each), 5-fold
cross-validated, AUC of the out-of-fold scores (Mann-Whitney; 0.5 = indistinguishable, 1 =
fully separable). Issue 44's report uses MiniLM sentence embeddings; this page uses
bag-of-words features because they cost milliseconds on 2 CPU cores (no encoder to run per
record) and because in this task the words themselves (which adjective with which label) are
the signal. Generation throughput: wall time of `synthesize` alone (not the training), tokens =
the generated tokens `generate` returned (end token excluded, dropped attempts included), on
the CPU.

Mean ± standard error over seeds {", ".join(map(str, seeds))} (each seed: the model's
initialisation, the job's noise and batches, the generation's draws).

{chr(10).join(table(rows, tor, majority))}

First records of seed {seeds[0]}:

{examples}

## Reading

Train-on-real accuracy is {100 * tor:.1f} % and the majority rate {100 * majority:.1f} %. The
non-private generator's records give {100 * tos_np:.1f} % train-on-synthetic
({100 * (tos_np - tor):+.1f} points from train-on-real) and a two-sample AUC of {auc_np:.3f}.

{chr(10).join(reading)}
"""


def main() -> None:
    global LR, DP_BATCH, DP_LR, HIDDEN, LAYERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 seed, ε = 8, fewer records, prints")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--epochs", type=float, default=EPOCHS)
    ap.add_argument("--eps", type=float, nargs="*", default=None, help="the DP rows' ε")
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument("--hidden", type=int, default=HIDDEN, help="the Llama's hidden size")
    ap.add_argument("--layers", type=int, default=LAYERS, help="the Llama's layers")
    ap.add_argument("--dp-batch", type=int, default=DP_BATCH)
    ap.add_argument("--dp-lr", type=float, default=DP_LR)
    ap.add_argument("--full", action="store_true", help="--quick with the default sizes")
    ap.add_argument("--no-page", action="store_true", help="print only")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    seeds = list(range(1 if args.quick else args.seeds))
    epsilons = (8.0,) if args.quick else EPSILONS
    if args.eps is not None:
        epsilons = tuple(args.eps)
    small = args.quick and not args.full
    n_train, n_test, n_synth = (600, 300, 200) if small else (N_TRAIN, N_TEST, N_SYNTH)
    LR, DP_BATCH, DP_LR = args.lr, args.dp_batch, args.dp_lr
    HIDDEN, LAYERS = args.hidden, args.layers
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    t_start = time.perf_counter()
    timer = GenerationTimer()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        train, test = write_data(folder, n_train, n_test)
        real = read_lines(train)
        tor = class_accuracy(real, test)
        counts = Counter(r["label"] for r in test)
        majority = max(counts.values()) / len(test)
        print(f"train-on-real {tor:.3f}, majority {majority:.3f}", flush=True)
        rows: dict[str, list[dict[str, Any]]] = {NP: []}
        rows.update({f"ε = {e:g}": [] for e in epsilons})
        for seed in seeds:
            r = run_nonprivate(folder, train, seed, n_synth, args.device, args.epochs, timer)
            score(r, test, seed)
            rows[NP].append(r)
            print(
                f"seed {seed} {NP}: tos {r['tos']:.3f} auc {r['auc']:.3f} "
                f"{r['records_per_s']:.0f} rec/s ({r['seconds']:.0f} s) {r['examples']}",
                flush=True,
            )
            for e in epsilons:
                r = run_dp(folder, train, seed, e, n_synth, args.device, args.epochs, timer)
                score(r, test, seed)
                rows[f"ε = {e:g}"].append(r)
                print(
                    f"seed {seed} ε={e:g}: σ {r['sigma']:.3f} σ_h {r['sigma_h']:.2f} "
                    f"ε spent {r['epsilon']:.3f} tos {r['tos']:.3f} auc {r['auc']:.3f} "
                    f"{r['records_per_s']:.0f} rec/s ({r['seconds']:.0f} s) {r['examples']}",
                    flush=True,
                )
    wall = time.perf_counter() - t_start
    print("\n".join(table(rows, tor, majority)))
    print(f"wall: {wall:.0f} s")
    for name, rs in rows.items():  # scripts/gpu_check.sh collects these lines
        print(
            f"summary: synthetic ({args.device}, hidden {HIDDEN}, {LAYERS} layers, {len(rs)} "
            f"seed(s)) {name}: train-on-synthetic "
            f"{pm([r['tos'] for r in rs], 100)} %, AUC {pm([r['auc'] for r in rs], 1, 3)}, "
            f"{statistics.fmean(r['records_per_s'] for r in rs):.0f} records/s"
        )
    if args.quick or args.no_page or args.device != "cpu":
        return
    argv = "python benchmarks/synthetic.py" + (f" --seeds {args.seeds}" if args.seeds != 3 else "")
    sizes = (n_train, n_test, n_synth)
    write_page(OUT, page(rows, tor, majority, seeds, argv, wall, sizes, args.epochs))


if __name__ == "__main__":
    main()
