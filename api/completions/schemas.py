"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions``, as OpenAI's API
takes them: the fields dprc serves are checked here, whatever engine answers; fields that would
change what is generated and that dprc does not serve (tools, logprobs, response formats,
penalties, logit biases) are refused naming the field, never ignored; the others (``user``,
``metadata``, ``store``…) are accepted and not used."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N = 8
MAX_STOPS = 4
MAX_TOKENS = 32_768
MAX_TEXT = 1_000_000  # characters of prompt or of one message (the body limit is 1 MiB)

# fields that change the output and that the engines here do not serve: refused by name
UNSERVED = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "response_format",
    "logit_bias",
    "audio",
    "modalities",
    "prediction",
    "echo",
    "suffix",
    "web_search_options",
)
ZERO_OK = ("presence_penalty", "frequency_penalty")  # served only as 0 (their default)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT)


class Message(BaseModel):
    """One chat message: text content (a string or text parts)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] = Field(max_length=MAX_TEXT)
    name: str | None = Field(default=None, max_length=256)

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(min_length=1, max_length=300)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s or len(s) > 256 for s in stops):
            raise ValueError("a stop sequence is 1 to 256 characters")
        return v

    @model_validator(mode="after")
    def _unserved(self) -> Sampling:
        extra = self.model_extra or {}
        for name in UNSERVED:
            if extra.get(name) not in (None, False):
                raise ValueError(f"{name} is not supported by dprc's engines")
        for name in ZERO_OK:
            value = extra.get(name)
            if value not in (None, 0, 0.0):
                raise ValueError(f"{name} other than 0 is not supported by dprc's engines")
        best_of = extra.get("best_of")
        if best_of not in (None, 1):
            raise ValueError("best_of other than 1 is not supported by dprc's engines")
        return self

    def engine_body(self) -> dict[str, Any]:
        """What is sent to the engine: the served fields that were given."""
        return self.model_dump(
            include=set(Sampling.model_fields) | self._own_fields(), exclude_none=True
        )

    def _own_fields(self) -> set[str]:
        return set()


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)

    def _own_fields(self) -> set[str]:
        return {"messages", "max_completion_tokens"}


class CompletionRequest(Sampling):
    prompt: str = Field(max_length=MAX_TEXT)

    def _own_fields(self) -> set[str]:
        return {"prompt"}
