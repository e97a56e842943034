"""DPTrainer with ``PrivacyArguments(unit="user")`` (issue 31): the plan counts users, each step
samples users and gives the engine each user's (at most m) rows in one micro-batch with their
user ids; the user column never reaches the model; bad settings are refused."""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict

import pytest
from transformers import default_data_collator

from dprc_core import PrivacyEngine
from dprc_core.integrations import DPTrainer, PrivacyArguments
from dprc_core.integrations.hf_trainer import DPTrainerError
from dprc_core.training.token_store import user_key
from tests.dprc_core.integrations.test_hf_trainer import llama, lm_examples, targs

# 11 users: one with 40 rows, five with 3, five with 1
USERS = (
    ["heavy"] * 40 + [f"mid{i}" for i in range(5) for _ in range(3)] + [f"one{i}" for i in range(5)]
)


def rows_with_users(field_name: str = "user_id") -> list[dict]:
    rows = lm_examples(n=len(USERS))
    for row, user in zip(rows, reversed(USERS), strict=True):  # users scattered over the rows
        row[field_name] = user
    return rows


def test_a_user_level_trainer_clips_users(tiny_llama_path, tmp_path, monkeypatch):
    calls: dict[int, list[list[int]]] = defaultdict(list)
    accumulate = PrivacyEngine.accumulate

    def recording(self, loss_fn, batch, example_ids=None, user_ids=None):
        assert "user_id" not in batch  # the user column never reaches the model
        calls[self.steps].append([int(u) for u in user_ids])
        return accumulate(self, loss_fn, batch, example_ids, user_ids)

    monkeypatch.setattr(PrivacyEngine, "accumulate", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a short plan: the learnability warning
        trainer = DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(tmp_path, num_train_epochs=2),
            train_dataset=rows_with_users(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(
                target_epsilon=8.0, norm_method="exact", unit="user", max_examples_per_user=2
            ),
        )
        plan = trainer.plan
        assert plan.unit == "user" and plan.dataset_size == 11
        assert plan.sample_rate == pytest.approx(8 / 11)  # 4 × 2 users expected a step
        trainer.train()
    assert trainer.engine is not None and trainer.engine.steps == plan.steps
    heavy = user_key("heavy")
    for step, parts in calls.items():
        seen = Counter(u for part in parts for u in part)
        assert max(seen.values(), default=0) <= 2  # at most m rows a user
        per_part = [set(p) for p in parts]
        for i, a in enumerate(per_part):  # each user in one micro-batch
            for b in per_part[i + 1 :]:
                assert not a & b, step
        if heavy in seen:
            assert seen[heavy] == 2
    assert any(heavy in {u for p in parts for u in p} for parts in calls.values())


def test_missing_user_column_and_bad_settings_are_refused(tiny_llama_path, tmp_path):
    with pytest.raises(DPTrainerError, match="no 'patient'"):
        DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(tmp_path),
            train_dataset=rows_with_users(),
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(
                target_epsilon=8.0, norm_method="exact", unit="user", user_field="patient"
            ),
        )
    with pytest.raises(ValueError, match="unit must be"):
        PrivacyArguments(target_epsilon=8.0, unit="person")
    with pytest.raises(ValueError, match="applies to unit='user'"):
        PrivacyArguments(target_epsilon=8.0, max_examples_per_user=2)
    with pytest.raises(ValueError, match="gaussian"):
        PrivacyArguments(
            target_epsilon=8.0,
            unit="user",
            noise_mechanism="nu_dpftrl",
            nu=0.1,
            norm_method="exact",
        )


def test_mixed_id_types_and_colliding_keys_are_refused(tiny_llama_path, tmp_path, monkeypatch):
    """Issue 40: 7 and "7" would be one user, and two ids sharing a user key would be merged
    into one unit; DPTrainer refuses both, as the store build does."""
    from dprc_core.integrations import hf_trainer

    def trainer(rows):
        return DPTrainer(
            model=llama(tiny_llama_path),
            args=targs(tmp_path),
            train_dataset=rows,
            data_collator=default_data_collator,
            privacy_args=PrivacyArguments(target_epsilon=8.0, norm_method="exact", unit="user"),
        )

    mixed = rows_with_users()
    mixed[3]["user_id"] = 7
    mixed[5]["user_id"] = "7"
    with pytest.raises(DPTrainerError, match="all strings or all integers"):
        trainer(mixed)
    # a 2-bit key: 11 distinct users cannot have 11 distinct keys
    monkeypatch.setattr(hf_trainer, "user_key", lambda user: user_key(user) & 3)
    with pytest.raises(DPTrainerError, match="user_key_collision"):
        trainer(rows_with_users())
