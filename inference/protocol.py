"""The request bodies the engine takes (OpenAI's, the subset dprc needs), validated with
pydantic, and the fields refused because they would change sampling in ways not implemented."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from inference.errors import APIError, bad_request

MAX_N = 8
SEED_RANGE = 2**63


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")
    model: Annotated[str, Field(min_length=1, max_length=512)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    seed: Annotated[int, Field(ge=-SEED_RANGE, lt=SEED_RANGE)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's extension: generate past the end token, to max_tokens

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, str) and not v or isinstance(v, list) and not all(v):
            raise ValueError("stop strings must not be empty")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def wants_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def new_tokens(self) -> int | None:
        return self.max_tokens


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    def new_tokens(self) -> int | None:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )


class CompletionRequest(Sampling):
    prompt: str | list[str]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16  # OpenAI's default for completions

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) == 1:
            return self.prompt[0]
        raise bad_request(
            "a list of prompts is not supported by this engine: send one prompt (a string) "
            "per request",
            param="prompt",
        )


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: Annotated[str, Field(min_length=1, max_length=512)]
    lora_path: Annotated[str, Field(min_length=1, max_length=4096)]
    base_model_path: Annotated[str, Field(min_length=1, max_length=4096)] | None = None


class UnloadAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: Annotated[str, Field(min_length=1, max_length=512)]


def _is_unset(value: Any, neutral: Any = None) -> bool:
    return value is None or value is False or value == neutral or value in ([], {})


# fields of OpenAI's bodies that change what is sampled: refused unless neutral
_UNSUPPORTED_CHAT = {
    "logprobs": None,
    "top_logprobs": None,
    "tools": None,
    "tool_choice": "none",
    "functions": None,
    "function_call": "none",
    "response_format": None,
    "logit_bias": None,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "min_tokens": 0,
    "best_of": 1,
    "audio": None,
    "prediction": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
}
_UNSUPPORTED_COMPLETION = {
    **_UNSUPPORTED_CHAT,
    "echo": None,
    "suffix": None,
}


def _check_unsupported(body: dict[str, Any], fields: dict[str, Any]) -> None:
    for name, neutral in fields.items():
        if name not in body:
            continue
        value = body[name]
        if name == "response_format" and value in ({"type": "text"}, None):
            continue
        if not _is_unset(value, neutral):
            raise bad_request(
                f"'{name}' is not supported by this engine", param=name, code="unsupported_field"
            )


def _first_error(err: ValidationError) -> APIError:
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ())]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    return bad_request(f"{param}: {msg}" if param else msg, param=param)


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    _check_unsupported(body, _UNSUPPORTED_CHAT)
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as err:
        raise _first_error(err) from None


def parse_completion(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    _check_unsupported(body, _UNSUPPORTED_COMPLETION)
    try:
        req = CompletionRequest.model_validate(body)
    except ValidationError as err:
        raise _first_error(err) from None
    req.prompt_text()  # a list of several prompts is refused here
    return req


def parse_model(cls: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    try:
        return cls.model_validate(body)
    except ValidationError as err:
        raise _first_error(err) from None
