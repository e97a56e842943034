"""Service settings, read from ``DPRC_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Task = Literal["causal_lm", "classification"]


class ModelSpec(BaseModel):
    """One allow-listed base model: a local folder of safetensors weights and its task."""

    path: Path | None = Field(
        default=None, description="local folder; None for a built-in model built on first use"
    )
    task: Task
    builtin: Literal["minilm", "tiny-llama"] | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DPRC_", extra="ignore")

    data_dir: Path = Path("./dprc-data")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL (postgresql+psycopg://...); default SQLite under data_dir",
    )
    broker_url: str | None = Field(default=None, description="redis://host:port (healthz)")
    max_upload_bytes: int = Field(
        default=50 * 1024 * 1024,
        description="the largest one-shot upload (POST /v1/files, read in memory); larger data "
        "sets go through the Uploads API (POST /v1/uploads, in parts)",
    )
    max_upload_total_bytes: int = Field(
        default=8 * 1024**3,
        ge=1,
        description="the most bytes an upload of the Uploads API (POST /v1/uploads) may "
        "announce; its parts stream to disk",
    )
    max_upload_part_bytes: int = Field(
        default=64 * 1024**2,
        ge=1,
        description="the largest part of an upload (POST /v1/uploads/{id}/parts)",
    )
    upload_expiry_seconds: int = Field(
        default=3600,
        ge=1,
        description="an upload not completed this long after its creation expires: its parts "
        "are deleted and its reserved bytes no longer count towards the storage quota",
    )
    upload_max_line_bytes: int = Field(
        default=8 * 1024**2,
        ge=1,
        description="the longest line of a data set completed through the Uploads API (its "
        "validation holds one line at a time); a longer one is 400 invalid_jsonl",
    )
    max_request_bytes: int = Field(
        default=1024 * 1024,
        description="largest body of any request but a file upload (JSON bodies), read before "
        "authentication; a larger one is refused with 413 without being read",
    )
    max_active_jobs_per_tenant: int = 16
    keep_checkpoints: int | None = Field(
        default=None,
        ge=1,
        description="keep the last K checkpoints of a finished job (the final one always); "
        "older archives are deleted and no longer listed for download. Unset: keep all. "
        "Ledgers, budgets, job events and the audit log are never deleted",
    )
    tenant_storage_bytes: int = Field(
        default=20 * 1024**3,
        ge=1,
        description="the most bytes a tenant's files (uploads and checkpoint archives, not "
        "deleted) may hold; an upload that would go beyond is refused with 413 "
        "storage_quota_exceeded (archives written by the worker count, but are never refused)",
    )
    models: dict[str, ModelSpec] = Field(
        default_factory=dict,
        description='extra allow-listed models, JSON: {"name": {"path": "/dir", "task": "..."}}',
    )
    builtin_models: bool = True
    warm_model_checks: bool = Field(
        default=True,
        description="run each allow-listed model's create check once at start-up (its imports "
        "then cost no create)",
    )
    accountant_process: bool = Field(
        default=True,
        description="run the accountant's calibrations and budget leaves of job creates in a "
        "child process of the API process (dprc_core.accounting.accountant_process): they "
        "then use a core of their own instead of the request threads' interpreter",
    )
    default_k: int = 32
    # -- workers (worker/) --
    embedded_worker: bool = Field(
        default=True, description="with no broker_url, run jobs in a thread of the API process"
    )
    lease_seconds: int = Field(default=60, ge=2, description="a job's lease; renewed every third")
    sweep_seconds: int = Field(
        default=30,
        ge=1,
        description="how often workers look for jobs "
        "whose worker died (expired lease) and queued jobs to start",
    )
    visibility_timeout_seconds: int = Field(
        default=7 * 24 * 3600, description="Redis redelivery timeout: longer than any job"
    )
    max_physical_batch_size: int = Field(default=16, ge=1, description="micro-batch size")
    base_learning_rate: float = Field(
        default=5e-4,
        gt=0,
        description="times learning_rate_multiplier when no learning_rate is given",
    )
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N")
    worker_devices: int = Field(
        default=1,
        ge=1,
        description="devices this worker gives one job (its ranks use cuda:0..N-1, or N CPU "
        "processes); a worker takes jobs with `devices` up to this and, with Celery, consumes "
        "the queues gpu, gpu-2, ..., gpu-N",
    )
    max_job_devices: int | None = Field(
        default=None,
        ge=1,
        description="the most devices a job may ask for (the largest worker's worker_devices); "
        "default: worker_devices. A job asking for more is refused at creation",
    )
    launcher: Literal["local", "ray"] = Field(
        default="local",
        description="how a job on several hosts is launched: local (none: jobs run on one "
        "host, their ranks under torchrun on the worker's host) or ray (jobs with nodes > 1 "
        "run through Ray Train on the cluster at DPRC_RAY_ADDRESS; docs/deploy.md)",
    )
    ray_address: str | None = Field(
        default=None,
        description="the Ray cluster's GCS address HOST:6379 (launcher ray); the worker's host "
        "must be a node of it (ray start --address=HOST:6379 --num-cpus=0)",
    )
    max_job_nodes: int = Field(
        default=1,
        ge=1,
        description="the most hosts a job may ask for (nodes; the API refuses more at creation); "
        "a worker with launcher ray takes jobs up to this many hosts. More than 1 with the "
        "embedded worker needs launcher ray",
    )
    ray_wait_seconds: float = Field(
        default=600.0,
        gt=0,
        description="how long an attempt waits for the Ray cluster to have the job's nodes "
        "before the job fails (nodes_unavailable)",
    )
    secure_rng: bool = Field(
        default=True,
        description="secure mode: Gaussian noise and Poisson batches from a ChaCha20 stream "
        "keyed from the OS, not torch's generator (docs/engine.md); ν-DP-FTRL jobs keep "
        "torch's generator and say so in an event",
    )
    rank_attempts: int = Field(
        default=3,
        ge=1,
        description="attempts of a multi-device job whose rank was killed before it is failed",
    )
    # -- governance (docs/governance.md) --
    default_epsilon_budget: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="tenant policy: the ε budget a fine-tune upload gets when it names none "
        "(echoed in the upload's answer); none: see require_budget",
    )
    require_budget: bool = Field(
        default=True,
        description="tenant policy: a fine-tune upload that names no budget, when there is no "
        "default_epsilon_budget, is refused (400); false: it has no budget (no limit)",
    )
    public_url: str | None = Field(
        default=None,
        description="the URL users reach the service at (https://dprc.example.org); an https "
        "one makes the dashboard's session cookie Secure",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses of reverse proxies whose X-Forwarded-Proto is believed (JSON "
        'list, e.g. ["10.0.0.5"]); a request through one of them with '
        "X-Forwarded-Proto: https gets a Secure session cookie",
    )
    log_level: str = Field(
        default="info",
        description="root log level of `dprc serve` and "
        "of the Celery workers: debug | info | warning | error",
    )
    metrics_token: str | None = Field(
        default=None,
        min_length=16,
        description="the bearer token GET /metrics needs (Prometheus exposition); unset: "
        "/metrics is 404",
    )
    # -- generation: /v1/chat/completions and /v1/completions (docs/inference.md) --
    inference_engine: Literal["embedded", "off"] = Field(
        default="embedded",
        description="embedded: the API starts its own generation engine (python -m inference, "
        "a separate process on 127.0.0.1) on the first completion request; off: completions "
        "are served only by vLLM (vllm_url) for the models it serves, else 400",
    )
    inference_url: str | None = Field(
        default=None,
        description="the URL of an embedded engine started apart (python -m inference); the "
        "API then does not start its own. Needs inference_token",
    )
    inference_token: str | None = Field(
        default=None,
        min_length=16,
        description="the bearer token of the engine at inference_url (a started engine gets a "
        "random one)",
    )
    inference_cache_bytes: int = Field(
        default=4 * 1024**3,
        ge=1,
        description="the embedded engine's model cache: the bytes of weights it keeps loaded; "
        "the least recently used model leaves first",
    )
    inference_max_batch: int = Field(
        default=8, ge=1, description="sequences the embedded engine generates at once"
    )
    inference_max_queue: int = Field(
        default=64,
        ge=0,
        description="requests that wait for the embedded engine; more are answered 429 with "
        "Retry-After",
    )
    inference_start_seconds: float = Field(
        default=180, gt=0, description="how long a request waits for the engine to start"
    )
    vllm_url: str | None = Field(
        default=None,
        description="a vLLM OpenAI-compatible server (http://vllm:8000) serving vllm_model with "
        "--enable-lora: that model and the LoRA fine-tunes of it are routed there",
    )
    vllm_model: str | None = Field(
        default=None,
        description="the allow-listed model the vLLM server serves (its --served-model-name)",
    )
    vllm_api_key: str | None = Field(default=None, description="vLLM's --api-key, if set")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text, or json: one JSON object a line with time, level, logger, message "
        "and request_id, tenant, key_id, job_id where known (service/base/logging_setup.py)",
    )

    @model_validator(mode="after")
    def _launcher_reaches_the_nodes(self) -> Settings:
        # an API process that runs its own worker must launch what it accepts (with Celery,
        # the API accepts up to DPRC_MAX_JOB_NODES and the workers that launch through Ray,
        # configured so, take those jobs: as DPRC_MAX_JOB_DEVICES and DPRC_WORKER_DEVICES)
        embedded = self.embedded_worker and not self.broker_url
        if embedded and self.max_job_nodes > 1 and self.launcher != "ray":
            raise ValueError(
                f"DPRC_MAX_JOB_NODES={self.max_job_nodes}: this server's embedded worker launches "
                "jobs on several hosts only through Ray; set DPRC_LAUNCHER=ray and "
                "DPRC_RAY_ADDRESS"
            )
        if self.launcher == "ray" and not self.ray_address:
            raise ValueError("DPRC_LAUNCHER=ray needs DPRC_RAY_ADDRESS (the cluster's HOST:6379)")
        return self

    @property
    def worker_nodes(self) -> int:
        """The most hosts a job this worker runs may span (through Ray; 1 without it)."""
        return self.max_job_nodes if self.launcher == "ray" else 1

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            url = self.database_url
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
            return url
        return f"sqlite:///{(self.data_dir / 'dprc.sqlite3').resolve()}"

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"


@lru_cache
def get_settings() -> Settings:
    return Settings()
