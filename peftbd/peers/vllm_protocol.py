"""The messages between this project and its vLLM side process (`peftbd.peers.vllm_side`): one
JSON object a line, each a pydantic model tagged by `kind`. The side process runs in vLLM's own
environment, so this module imports nothing but pydantic and the standard library."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NgramSpec(_Message):
    """vLLM's `ngram` proposer settings (our `prompt_lookup` section's, by the same names)."""

    num_tokens: int = Field(ge=1)
    min_ngram: int = Field(ge=1)
    max_ngram: int = Field(ge=1)


class DflashSpec(_Message):
    """vLLM's `dflash` proposer: a drafter directory (`peftbd.peers.dflash_export`) and the
    tokens it drafts a round."""

    model_dir: str
    num_tokens: int = Field(ge=1)


class Load(_Message):
    """Start the side process's engine (one per process)."""

    kind: Literal["load"] = "load"
    model_dir: str
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_model_len: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    threads: int = Field(default=1, ge=1)
    memory_share: float = Field(default=0.1, gt=0, le=1)
    """vLLM's `gpu_memory_utilization`: on CPU the share of RAM it reserves for the KV cache."""
    seed: int = 0
    ngram: NgramSpec | None = None
    dflash_drafter: DflashSpec | None = None
    enforce_eager: bool = False

    @model_validator(mode="after")
    def _one_method(self) -> Load:
        if self.ngram is not None and self.dflash_drafter is not None:
            raise ValueError("ngram and dflash_drafter are both set: an engine runs one speculative method")
        return self


class Generate(_Message):
    """Greedy decoding of `prompts` (token ids, no chat template: they are rendered already),
    at most the engine's `max_num_seqs` at once, each to one of `stop_token_ids` or `max_tokens`."""

    kind: Literal["generate"] = "generate"
    prompts: list[list[int]]
    max_tokens: int = Field(ge=1)
    stop_token_ids: list[int] = []


class Stop(_Message):
    kind: Literal["stop"] = "stop"


class Ready(_Message):
    """An engine loaded: vLLM's version, its device, and the seconds the load took."""

    kind: Literal["ready"] = "ready"
    vllm_version: str
    device: str
    load_s: float


class Generated(_Message):
    """Each prompt's output token ids (a stop token included, as our engine's), the wall seconds
    from the first request added to the last finished, the engine steps (each one verifier
    forward over the running requests), and each request's steps summed; with a speculative
    method, vLLM's own count over the call of the draft tokens accepted at each draft position
    (its `spec_decode_num_accepted_tokens_per_pos`)."""

    kind: Literal["generated"] = "generated"
    outputs: list[list[int]]
    seconds: float
    steps: int
    request_steps: int
    accepted_per_position: list[int] | None = None


class Failed(_Message):
    """A request that raised in the side process: its type and message, and the traceback."""

    kind: Literal["failed"] = "failed"
    error: str
    traceback: str = ""


Request = Annotated[Load | Generate | Stop, Field(discriminator="kind")]
Reply = Annotated[Ready | Generated | Failed, Field(discriminator="kind")]
REQUEST: TypeAdapter[Request] = TypeAdapter(Request)
REPLY: TypeAdapter[Reply] = TypeAdapter(Reply)
