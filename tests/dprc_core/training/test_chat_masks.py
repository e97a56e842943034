"""Chat and prompt-completion lines train what TRL's SFTTrainer trains: the labels dprc builds
(in memory and in its tokenized store) equal, token for token, the labels of the data set TRL
prepares (``assistant_only_loss=True`` for chats, completion-only loss for prompt-completion
lines), with and without truncation, for the default template, a real template with
generation markers and one TRL patches; plus OpenAI's ``weight``, the refusals with their line
numbers, and a DP job on chat lines (docs/data.md, "Chat lines")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dprc_core.losses import causal_lm_per_sample_loss
from dprc_core.training import token_store
from dprc_core.training.chat_template import DEFAULT_CHAT_TEMPLATE
from dprc_core.training.data import DataError, parse_jsonl, summarize_jsonl, tokenize

CHATS = [
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "Six, obviously."},
    ],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue"},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "Green, then red."},
        {"role": "user", "content": "Thanks"},
        {"role": "assistant", "content": "You're welcome!"},
    ],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Bonjour à vous"},
    ],
    [
        {"role": "user", "content": "Spell it: cat"},
        {"role": "assistant", "content": " c a t "},
        {"role": "user", "content": "now dog"},
        {"role": "assistant", "content": "d o g"},
    ],
]
PAIRS = [
    {"prompt": "Q: What is 2+2? A:", "completion": " 4, since two and two make four."},
    {"prompt": "Translate: hello ->", "completion": " bonjour, mes amis"},
    {"prompt": "The sky is ", "completion": "blue, then red."},  # tokens may merge across it
    {"prompt": "Name a colour:", "completion": " Green, then red.</s>"},  # already ends with eos
]
MARV = {
    "messages": [
        {"role": "system", "content": "Marv is a factual chatbot that is also sarcastic."},
        {"role": "user", "content": "What's the capital of France?"},
        {"role": "assistant", "content": "Paris", "weight": 0},
        {"role": "user", "content": "Can you be more sarcastic?"},
        {
            "role": "assistant",
            "content": "Paris, as if everyone doesn't know that already.",
            "weight": 1,
        },
    ]
}


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory) -> Path:
    """A byte-level BPE with merges (tokens cross the template's span boundaries), a BOS
    post-processor (the prompt-completion path adds special tokens, the chat path does not)
    and ChatML's special tokens, trained here on the test's own text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [m["content"] for chat in CHATS for m in chat] * 20
    corpus += [p["prompt"] + p["completion"] for p in PAIRS] * 20
    corpus += ["<|user|>\n <|assistant|>\n system user assistant Qwen Alibaba Cloud"] * 20
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus, trainer)
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    path = tmp_path_factory.mktemp("bpe")
    tok.save_pretrained(path)
    return path


def trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


TEMPLATES = {
    "default": lambda: DEFAULT_CHAT_TEMPLATE,  # as a job sets it on a tokenizer without one
    "qwen2_5_training": lambda: trl_template("qwen2_5_training"),  # markers of its own
    "qwen2_5": lambda: trl_template("qwen2_5"),  # no markers: TRL's training version is used
}


def load_tok(bpe_dir: Path, template: str | None):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(bpe_dir)
    tok.chat_template = None if template is None else TEMPLATES[template]()
    return tok


@pytest.fixture(scope="session")
def trl_model(bpe_dir):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(load_tok(bpe_dir, None)),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def trl_rows(model, tok, rows: list[dict], max_length: int, tmp_path: Path) -> list[dict]:
    """The rows of the data set TRL's SFTTrainer prepares (its labels: -100 where untrained)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    chat = "messages" in rows[0]
    args = SFTConfig(
        output_dir=str(tmp_path / "trl"),
        assistant_only_loss=chat,
        completion_only_loss=None if chat else True,
        max_length=max_length,
        report_to=[],
        use_cpu=True,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    return list(trainer.train_dataset)


def ours(tok, rows: list[dict], max_seq_len: int, tmp_path: Path) -> list[tuple[list, list]]:
    """(input_ids, labels) of each line, in memory and from the store (asserted equal)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows]
    memory = tokenize(parse_jsonl(lines, "causal_lm"), tok, max_seq_len)
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    store = token_store.open_or_build(
        path, tok, max_seq_len, "causal_lm", None, tmp_path / "stores"
    )
    assert (store.path / token_store.TRAINED).exists() and len(store) == len(rows)
    assert token_store.TRAINED in store.meta["sha256"]
    idx = list(range(len(rows)))
    a, b = memory.batch(idx), store.batch(idx)  # padded together: padding is never trained
    for key in ("input_ids", "attention_mask", "labels"):
        assert torch.equal(a[key], b[key]), key
    assert bool((a["labels"][a["attention_mask"] == 0] == -100).all())
    out = []
    for i in idx:
        n = int(a["attention_mask"][i].sum())
        out.append((a["input_ids"][i, :n].tolist(), a["labels"][i, :n].tolist()))
    return out


def shortest_keeping_a_target(rows: list[dict]) -> int:
    """A max_length that cuts lines (most of them) yet leaves each one a trained target."""
    first = [next(j for j, x in enumerate(r["labels"]) if x != -100 and j > 0) for r in rows]
    length = max(first) + 2
    assert any(length < len(r["input_ids"]) for r in rows)  # it cuts
    return length


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_chat_labels_equal_trls(bpe_dir, trl_model, template, tmp_path):
    rows = [{"messages": chat} for chat in CHATS]
    tok = load_tok(bpe_dir, template)
    full = trl_rows(trl_model, tok, rows, 2048, tmp_path)
    cut = shortest_keeping_a_target(full)
    for max_len, want in [(2048, full), (cut, trl_rows(trl_model, tok, rows, cut, tmp_path))]:
        assert len(want) == len(rows)  # TRL dropped none
        got = ours(load_tok(bpe_dir, template), rows, max_len, tmp_path / str(max_len))
        for (ids, labels), row in zip(got, want, strict=True):
            assert ids == row["input_ids"]
            assert labels == row["labels"]
    # what is trained: the answers and their end-of-turn token, nothing of the prompts
    trained = [tok.decode([x for x in row["labels"] if x != -100]) for row in full]
    end = "<|im_end|>\n" if template.startswith("qwen") else "</s>"
    assert trained[0].replace("\n", "") == f"4.{end}Six, obviously.{end}".replace("\n", "")
    assert "Name a colour" not in trained[1] and "You're welcome!" in trained[1]


@pytest.mark.parametrize("cut", [False, True])
def test_prompt_completion_labels_equal_trls(bpe_dir, trl_model, cut, tmp_path):
    tok = load_tok(bpe_dir, None)
    want = trl_rows(trl_model, tok, PAIRS, 2048, tmp_path)
    max_len = 2048
    if cut:
        max_len = shortest_keeping_a_target(want)
        want = trl_rows(trl_model, tok, PAIRS, max_len, tmp_path)
    assert len(want) == len(PAIRS)
    got = ours(load_tok(bpe_dir, None), PAIRS, max_len, tmp_path)
    for (ids, labels), row in zip(got, want, strict=True):
        assert ids == row["input_ids"] and labels == row["labels"]
    if not cut:  # the completion and one end-of-sequence token are trained, from BOS on
        assert got[0][0][0] == tok.bos_token_id
        assert tok.decode([x for x in got[0][1] if x != -100]) == f"{PAIRS[0]['completion']}</s>"
        assert tok.decode([x for x in got[3][1] if x != -100]).count("</s>") == 1


def test_openai_weights_leave_weight_0_answers_untrained(bpe_dir, trl_model, tmp_path):
    tok = load_tok(bpe_dir, "default")
    unweighted = {
        "messages": [{"role": m["role"], "content": m["content"]} for m in MARV["messages"]]
    }
    (row,) = trl_rows(trl_model, tok, [unweighted], 2048, tmp_path)  # both answers trained
    ((ids, labels),) = ours(tok, [MARV], 2048, tmp_path)
    assert ids == row["input_ids"]
    dropped = [i for i, (a, b) in enumerate(zip(labels, row["labels"], strict=True)) if a != b]
    assert all(labels[i] == -100 for i in dropped)
    assert tok.decode([ids[i] for i in dropped]) == "Paris</s>"
    assert tok.decode([x for x in labels if x != -100]) == (
        "Paris, as if everyone doesn't know that already.</s>"
    )
    # a chat line's identity is its messages joined as before, whatever the weights
    (ex,) = parse_jsonl([json.dumps(MARV)], "causal_lm").items
    assert ex.text == "\n".join(f"{m['role']}: {m['content']}" for m in MARV["messages"])


def msg(role: str, content: str = "x", **kw) -> dict:
    return {"role": role, "content": content, **kw}


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"messages": [msg("user"), msg("system")]}, "line 3: no assistant message"),
        (
            {"messages": [msg("user"), msg("assistant", weight=0)]},
            "line 3: every assistant message has weight 0",
        ),
        ({"messages": [msg("user"), msg("assistant", weight=2)]}, "line 3: .* weight 2"),
        ({"messages": [msg("user"), msg("assistant", weight=0.5)]}, "line 3: .* weight 0.5"),
        ({"messages": [msg("user"), msg("assistant", weight=True)]}, "line 3: .* weight true"),
        (
            {"messages": [msg("user", weight=1), msg("assistant")]},
            "line 3: .*user message with a 'weight'",
        ),
        (
            {"messages": [msg("user"), msg("assistant", tool_calls=[])]},
            "line 3: .*unsupported key 'tool_calls'",
        ),
        ({"messages": [msg("user", name=3), msg("assistant")]}, "line 3: .*'name' must be"),
        ({"prompt": "a", "completion": 3}, "line 3: a prompt-completion line needs"),
        ({"prompt": "a"}, "line 3: a prompt-completion line needs"),
        ({"prompt": "a", "completion": "b", "text": "c"}, r"line 3: unknown fields \['text'\]"),
    ],
)
def test_bad_chat_and_prompt_completion_lines_are_refused_at_upload(bad, match):
    good = {"messages": [msg("user"), msg("assistant")]}
    if "prompt" in bad:
        good = {"prompt": "a", "completion": "b"}
    lines = [json.dumps(good), "", json.dumps(bad)]  # line 3 (a blank line 2)
    with pytest.raises(DataError, match=match):
        summarize_jsonl(lines)
    summarize_jsonl([json.dumps(good), json.dumps(good)])  # the good line passes


@pytest.mark.parametrize(
    "row",
    [
        {"messages": [msg("user", "long question " * 20), msg("assistant", "yes")]},
        {"prompt": "long prompt " * 20, "completion": "yes"},
    ],
)
def test_truncation_that_leaves_nothing_to_train_names_the_line(bpe_dir, row, tmp_path):
    tok = load_tok(bpe_dir, None)  # chats: the default template
    short = {"messages": [msg("user", "hi"), msg("assistant", "ok")]}
    if "prompt" in row:
        short = {"prompt": "hi", "completion": "ok"}
    lines = [json.dumps(short), "", json.dumps(row)]  # line 3, example 2
    with pytest.raises(DataError, match=r"line 3: no (answer|completion) token is left"):
        tokenize(parse_jsonl(lines, "causal_lm"), tok, 24)
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 3: no (answer|completion) token is left"):
        token_store.open_or_build(path, tok, 24, "causal_lm", None, tmp_path / "s")
    tokenize(parse_jsonl(lines, "causal_lm"), tok, 512)  # a longer max_seq_len trains it


def test_a_long_line_is_cut_to_a_window_with_the_same_tokens(bpe_dir):
    from dprc_core.training import data

    tok = load_tok(bpe_dir, "default")
    messages = [msg("user", "hi"), msg("assistant", "ok"), msg("user", "x y " * 20_000)]
    messages.append(msg("assistant", "end"))
    ref = tok.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
    (got,) = data.masked_ids(
        tok, parse_jsonl([json.dumps({"messages": messages})], "causal_lm").items, 64
    )
    assert got == (ref["input_ids"][:64], ref["assistant_masks"][:64])


def test_templates_that_cannot_tell_the_answers_are_refused(bpe_dir):
    line = [json.dumps({"messages": [msg("user"), msg("assistant", "a"), msg("assistant", "b")]})]
    tok = load_tok(bpe_dir, None)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.name_or_path = "acme/no-markers"
    with pytest.raises(DataError, match="model 'acme/no-markers' does not mark the assistant"):
        tokenize(parse_jsonl(line, "causal_lm"), tok, 64)
    tok.chat_template = (  # one span for the whole chat: not one per answer
        "{% generation %}{% for m in messages %}{{ m['content'] }}{% endfor %}{% endgeneration %}"
    )
    with pytest.raises(DataError, match="line 1: the chat template marks 1 answer.* 2 assistant"):
        tokenize(parse_jsonl(line, "causal_lm"), tok, 64)


def test_text_lines_and_store_keys(bpe_dir, tmp_path):
    tok = load_tok(bpe_dir, None)
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "hello there"}\n{"text": "Blue sky"}\n')
    store = token_store.open_or_build(text, tok, 16, "causal_lm", None, tmp_path / "s")
    assert "labels" not in store.batch([0, 1]) and store.trained(0) is None
    assert not (store.path / token_store.TRAINED).exists()
    assert store.ids(0) == tok("hello there")["input_ids"]  # no eos added, BOS as today
    # the chat template is part of the key: another template, another store
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": CHATS[0]}) + "\n")
    a = token_store.open_or_build(chat, tok, 64, "causal_lm", None, tmp_path / "s")
    b = token_store.open_or_build(
        chat, load_tok(bpe_dir, "qwen2_5_training"), 64, "causal_lm", None, tmp_path / "s"
    )
    assert a.path != b.path and a.ids(0) != b.ids(0)
    assert a.meta["version"] == token_store.STORE_VERSION == 2 and a.format == "chat"


def test_a_dp_job_on_chat_lines_trains_the_answers_only(tmp_path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from dprc_core.training.runner import JobSpec, run_job
    from dprc_core.training.tiny import build_tiny_llama

    model_dir = build_tiny_llama(tmp_path / "llama", hidden=32)  # its tokenizer: no template
    train = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [msg("user", f"say {c}{c}"), msg("assistant", f"{c}{c}{c}")]}
        for c in "abcdefghijklmnop"
    ]
    train.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    spec = JobSpec(
        model=str(model_dir),
        task="causal_lm",
        train_file=str(train),
        output_dir=str(tmp_path / "out"),
        epochs=1.0,
        batch_size=8,
        learning_rate=1e-2,
        max_seq_len=64,
        seed=3,
        target_epsilon=8.0,
        max_physical_batch_size=4,
        token_store=str(tmp_path / "stores"),
    )
    result = run_job(spec)
    assert result.status == "succeeded" and result.steps_done >= 1
    saved = AutoTokenizer.from_pretrained(Path(result.checkpoint) / "model")
    assert saved.chat_template == DEFAULT_CHAT_TEMPLATE  # served as it was trained
    # the per-sample loss is the mean over the answer's tokens only
    store = token_store.open_or_build(train, saved, 64, "causal_lm", None, tmp_path / "stores")
    batch = store.batch([0, 1])
    model = LlamaForCausalLM.from_pretrained(Path(result.checkpoint) / "model").double().eval()
    loss = causal_lm_per_sample_loss(model, batch)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    targets = batch["input_ids"][:, 1:]
    nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    answer = torch.zeros_like(targets, dtype=torch.bool)
    head = saved("<|assistant|>\n", add_special_tokens=False)["input_ids"]
    for row in range(2):  # the answer's tokens, found from the ids independently
        ids = batch["input_ids"][row].tolist()
        first = next(i for i in range(len(ids)) if ids[i : i + len(head)] == head) + len(head)
        n_answer = len(
            saved(rows[row]["messages"][1]["content"], add_special_tokens=False)["input_ids"]
        )
        assert ids[first + n_answer] == saved.eos_token_id
        answer[row, first - 1 : first + n_answer] = True  # target t + 1 predicted at t
    want = (nll * answer).sum(1) / answer.sum(1)
    assert torch.allclose(loss, want.to(loss.dtype), atol=1e-6)
    every = (nll * batch["attention_mask"][:, 1:]).sum(1) / batch["attention_mask"][:, 1:].sum(1)
    assert not torch.allclose(loss, every.to(loss.dtype), atol=1e-3)  # the test can fail
    # changing an answer's target changes the loss (the labels are what is read)
    labels = batch["labels"].clone()
    k = int((labels[0] != -100).nonzero()[0])
    labels[0, k] = (labels[0, k] + 1) % len(saved)
    moved = causal_lm_per_sample_loss(model, {**batch, "labels": labels})
    assert not torch.isclose(moved[0], loss[0]) and torch.equal(moved[1], loss[1])


def test_a_prompt_completion_lines_identity_is_its_text(tmp_path):
    from service.data.example_hashes import hash_examples

    secret = b"k" * 32
    pairs = [{"prompt": "Hello ", "completion": "World"}, {"prompt": "a", "completion": "b"}]
    texts = [{"text": "hello  world"}, {"text": "ab"}]  # canonically the same texts
    digests = [
        list(hash_examples("\n".join(json.dumps(r) for r in rows).encode(), secret).digests)
        for rows in (pairs, texts)
    ]
    assert digests[0] == digests[1]
    (ex, _) = parse_jsonl([json.dumps(p) for p in pairs], "causal_lm").items
    assert ex.format == "prompt_completion" and ex.text == "Hello World"
