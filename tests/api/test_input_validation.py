"""Accepted means it runs (issue 16 item 5): what the worker would refuse is refused at upload or
at create, with a 400 naming the line or the field and why, by the library's own validators."""

from __future__ import annotations

import json

import pytest

from dprc_core.training.data import label_names, parse_jsonl
from dprc_core.training.models import ModelSettingError, check_trainable, max_positions
from service.models import builtin_models
from tests.api.conftest import jsonl, labelled_lines, text_lines


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def _upload(http, body: bytes):
    return http.post("/v1/files", files={"file": ("d.jsonl", body)}, data={"purpose": "fine-tune"})


def test_upload_reads_lines_as_the_worker_does(server):
    with server.http(server.key("lines-as-worker")) as http:
        # 1 and "1" are one class to the worker (its label names are strings)
        one_class = jsonl([{"text": "a", "label": 1}, {"text": "b", "label": "1"}])
        err = _error(_upload(http, one_class), 400)
        assert "2 classes" in err["message"] and err["param"] == "file", err
        # the worker's classes of it: one, which it refuses (runner.prepare_data)
        assert label_names(parse_jsonl(one_class.splitlines(), "classification").labels) == ["1"]
        # the chat roles the worker reads are accepted at upload
        chat = jsonl(
            [
                {
                    "messages": [
                        {"role": "developer", "content": "be brief"},
                        {"role": "assistant", "content": "ok"},
                    ]
                },
                {
                    "messages": [
                        {"role": "user", "content": "hi"},
                        {"role": "tool", "content": "x"},
                        {"role": "assistant", "content": "y"},
                    ]
                },
            ]
        )
        r = _upload(http, chat)
        assert r.status_code == 200 and r.json()["format"] == "chat", r.text
        assert len(parse_jsonl(chat.splitlines(), "causal_lm")) == 2
        # a chat line with nothing to train is refused with its line; prompt-completion lines
        # are a format of their own (17 characters: files.data_format holds 32)
        no_answer = jsonl([{"messages": [{"role": "user", "content": "hi"}]}] * 2)
        err = _error(_upload(http, no_answer), 400)
        assert "line 1: no assistant message" in err["message"], err
        pairs = jsonl([{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}])
        r = _upload(http, pairs)
        assert r.status_code == 200 and r.json()["format"] == "prompt_completion", r.text
        # other whitespace than spaces is still only whitespace
        err = _error(_upload(http, jsonl([{"text": "a"}, {"text": "\u2028\u3000\t"}])), 400)
        assert "line 2" in err["message"] and "whitespace" in err["message"], err


def _job(http, **patch):
    body = {
        "model": "minilm-l6-v2",
        "hyperparameters": {"n_epochs": 1, "batch_size": 10},
        "privacy": {"target_epsilon": 2.0, "clipping": {"method": "exact"}},
    }
    body.update(patch)
    return http.post("/v1/fine_tuning/jobs", json=body)


def test_create_checks_settings_against_the_model(server):
    key = server.key("model-settings")
    with server.http(key) as http:
        cls = _upload(http, labelled_lines(40)).json()["id"]
        lm = _upload(http, text_lines(40)).json()["id"]
        hp = {"n_epochs": 1, "batch_size": 10}
        bad = [
            # MiniLM has 512 positions
            (cls, "minilm-l6-v2", {**hp, "max_seq_len": 1024}, "hyperparameters.max_seq_len"),
            # the tiny Llama too
            (lm, "dprc-tiny-llama", {**hp, "max_seq_len": 600}, "hyperparameters.max_seq_len"),
            # BERT's attention projections are query/key/value: the default q_proj/v_proj
            # match nothing
            (cls, "minilm-l6-v2", {**hp, "lora": {"r": 4}}, "hyperparameters.lora.target_modules"),
            (
                cls,
                "minilm-l6-v2",
                {**hp, "lora": {"r": 4, "target_modules": ["query", "nope"]}},
                "hyperparameters.lora.target_modules",
            ),
            (  # matches, but a LayerNorm cannot carry LoRA adapters
                cls,
                "minilm-l6-v2",
                {**hp, "lora": {"r": 4, "target_modules": ["LayerNorm"]}},
                "hyperparameters.lora.target_modules",
            ),
            (
                cls,
                "minilm-l6-v2",
                {**hp, "train_only": ["no_such_part"]},
                "hyperparameters.train_only",
            ),
            (  # with LoRA only the adapters and the head train: the embeddings are frozen
                cls,
                "minilm-l6-v2",
                {
                    **hp,
                    "lora": {"r": 4, "target_modules": ["query"]},
                    "train_only": ["word_embeddings"],
                },
                "hyperparameters.train_only",
            ),
        ]
        for file_id, model, hyper, param in bad:
            err = _error(_job(http, model=model, training_file=file_id, hyperparameters=hyper), 400)
            assert err["param"] == param, (hyper, err)
        assert http.get("/v1/fine_tuning/jobs").json()["data"] == []
        ok = [
            (cls, "minilm-l6-v2", {**hp, "max_seq_len": 512}),
            (cls, "minilm-l6-v2", {**hp, "lora": {"r": 4, "target_modules": ["query", "value"]}}),
            (cls, "minilm-l6-v2", {**hp, "train_only": ["classifier"]}),
            (lm, "dprc-tiny-llama", {**hp, "max_seq_len": 512, "lora": {"r": 4}}),
        ]
        for file_id, model, hyper in ok:
            r = _job(http, model=model, training_file=file_id, hyperparameters=hyper)
            assert r.status_code == 200, (hyper, r.text)
            assert http.post(f"/v1/fine_tuning/jobs/{r.json()['id']}/cancel").status_code == 200


def test_the_validators_agree_with_loading_the_model():
    """The meta-device check selects the parameters that loading the real model and applying
    the runner's rules selects."""
    from dprc_core.training.models import LoraSpec, load_model, matches_train_only

    path = builtin_models.minilm_dir()
    assert path is not None
    config = json.loads((path / "config.json").read_text())
    assert max_positions(path) == config["max_position_embeddings"] == 512
    lora = LoraSpec(r=2, alpha=4, target_modules=["query", "value"])
    for spec, parts in ((None, None), (None, ["classifier", "layer.5"]), (lora, ["layer.0"])):
        model = load_model(path, "classification", num_labels=3, lora=spec)
        expect = [
            n
            for n, p in model.named_parameters()
            if p.requires_grad and (parts is None or matches_train_only(n, parts))
        ]
        assert check_trainable(path, "classification", spec, parts) == expect
    with pytest.raises(ModelSettingError) as exc:
        check_trainable(path, "classification", LoraSpec(target_modules=["q_proj"]), None)
    assert exc.value.field == "lora" and "query" in str(exc.value)


def test_a_json_body_without_its_content_type_is_a_clear_415(server):
    """``curl -d '{...}'`` sends application/x-www-form-urlencoded: a 415 that says what to
    send, not a vague 422; a JSON body that is not JSON stays 422."""
    body = b'{"model": "minilm-l6-v2", "training_file": "file-x", "privacy": {"target_epsilon": 1}}'
    with server.http(server.key("content-type")) as http:
        for headers in ({"Content-Type": "application/x-www-form-urlencoded"}, {}):
            for path in ("/v1/fine_tuning/jobs", "/v1/files/file-x/budget"):
                r = http.post(path, content=body, headers=headers)
                err = _error(r, 415)
                assert err["code"] == "unsupported_media_type", err
                assert "Content-Type: application/json" in err["message"], err
        r = http.post(
            "/v1/fine_tuning/jobs",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert _error(r, 422)["code"] == "invalid_value"
        r = http.post(
            "/v1/fine_tuning/jobs", content=body, headers={"Content-Type": "application/json"}
        )
        assert _error(r, 404)["param"] == "training_file"  # the same body, with its type: read
