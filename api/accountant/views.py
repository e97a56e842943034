"""The accountant's requests as :mod:`service.jobs.accounting`'s queries and its answers as the
API's objects."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal, cast

from api.accountant.schemas import (
    AccountantResult,
    EpsilonRequest,
    JobPlanPreview,
    NoiseMultiplierRequest,
    PlanBudget,
)
from service.jobs import accounting

ResultKind = Literal["accountant.epsilon", "accountant.noise_multiplier"]


def query(req: EpsilonRequest | NoiseMultiplierRequest) -> accounting.AccountantQuery:
    return accounting.AccountantQuery(
        steps=req.steps,
        mechanism=req.mechanism,
        sample_rate=req.sample_rate,
        nu=req.nu,
        bands=req.bands,
        participations=req.participations,
        min_separation=req.min_separation,
        clipping=req.clipping,
        k=req.k,
        rank=req.rank,
        sketch=req.sketch,
    )


def result(kind: ResultKind, answer: accounting.AccountantAnswer) -> AccountantResult:
    return AccountantResult(object=kind, **asdict(answer))


def plan_preview(preview: accounting.JobPlanPreview) -> JobPlanPreview:
    plan, fit = preview.plan, preview.budget
    return JobPlanPreview(
        training_file=preview.training_file,
        n_examples=preview.n_examples,
        unit=cast(Literal["example", "user"], plan.unit),
        n_epochs=plan.n_epochs,
        batch_size=plan.batch_size,
        sample_rate=plan.sample_rate,
        steps=plan.steps,
        target_epsilon=plan.target_epsilon,
        target_delta=plan.target_delta,
        noise_multiplier=plan.noise_multiplier,
        planned_epsilon=plan.planned_epsilon,
        mechanism=plan.mechanism,
        norm_method=plan.method,
        clipping=plan.method,
        k=plan.k,
        sketch=preview.sketch,
        accounting_clipping=plan.accounting_envelope,
        accounting_k=plan.accounting_k,
        accounting_sketch=plan.sketch,
        budget=PlanBudget(**asdict(fit)) if fit is not None else None,
    )
