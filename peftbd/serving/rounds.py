"""What a server streams per speculative round, and the per-request totals reported in `usage`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from peftbd.serving.schemas import FinishReason, SpecStats


@dataclass
class RoundEvent:
    """One step of a request as the ingress sees it (plain data: the Engine or the Verifier
streams it to the Ingress as this object, pickled by Ray).

    `tokens`: what the step committed (EOS included when it stopped there); `accepted`: the draft
    tokens among them (the engine's count: none past the EOS or budget that ended the output). The prefill step
    (`prefill=True`) commits the first token and is not a speculative round. Times are what the
    replicas measured: draft and verify calls, `sync_ms` (a split drafter catching its copy of
    the verifier state up, or any replica rebuilding a lost state), `other_ms` (the rest of the
    replica-side work; a prefill step's: its prefill), `queued_ms` (the replica's time since the
    request's previous step that none of those took: waiting for admission, for other requests'
    prefill chunks, for its turn in the step loop); `transport_ms` is the time outside the
    replicas: the ingress-side wall time of the step minus all of those, plus a split
    Verifier's hops to its Drafter. `resumes` counts replicas that had to rebuild the request's state for this step;
    `finish_reason` (`stop` on EOS, else `length`) is set on the last step. `feature_bytes`:
    the verifier state the step's propose carried to a split Drafter (the head's features,
    FastMTP's hidden states, PEFT-BD's KV, of the positions cached since its last call: the
    first round's carries the prompt's), else 0. `batch_size`: the rows of the step's batched
    forward.
    """

    tokens: list[int]
    proposed: int = 0
    accepted: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    sync_ms: float = 0.0
    other_ms: float = 0.0
    queued_ms: float = 0.0
    transport_ms: float = 0.0
    resumes: int = 0
    feature_bytes: int = 0
    batch_size: int = 1
    done: bool = False
    prefill: bool = False
    pre_drafted: bool = False  # its draft was drafted ahead, during the previous round's verify
    finish_reason: FinishReason | None = None

    @property
    def compute_ms(self) -> float:
        """Replica-side milliseconds of this step."""
        return self.draft_ms + self.verify_ms + self.sync_ms + self.other_ms

    @property
    def replica_ms(self) -> float:
        """All the replica-side milliseconds of this step: its compute and its waits."""
        return self.compute_ms + self.queued_ms

    def positions(self) -> tuple[range, range]:
        """The draft positions (1-based) this step proposed, and those it accepted (its accepted
        prefix reached them), as the engine's `per_position` counts them."""
        return range(1, self.proposed + 1), range(1, self.accepted + 1)

    def received(self, n: int) -> RoundEvent:
        """This step as the client received its first `n` tokens (a stop sequence ended the text
        inside it): the tokens after them, and draft tokens accepted among them, are not counted."""
        if n >= len(self.tokens):
            return self
        return replace(self, tokens=self.tokens[:n], accepted=min(self.accepted, n))


def temperature_band(temperature: float) -> str:
    """The metrics' band of a sampling temperature: "0" (greedy), "(0,0.5]", "(0.5,1]", "(1,2]"."""
    if temperature < 1e-5:
        return "0"
    return "(0,0.5]" if temperature <= 0.5 else "(0.5,1]" if temperature <= 1 else "(1,2]"


@dataclass
class RequestStats:
    """Sums over one request's speculative rounds; the prefill step's time goes to `prefill`.
    Add steps as the client received them (`RoundEvent.received`), so tokens and accepted
    tokens stop where its text stopped."""

    method: str
    synthetic: float | None = None  # the controlled acceptance (tokens/round) it was served at
    temperature: float = 0.0  # its sampling temperature (0: greedy)
    rounds: int = 0
    pre_drafted: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0
    resumes: int = 0
    feature_bytes: int = 0
    batch_size_sum: int = 0
    prefill_batch_size: int = 0
    times_ms: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("prefill", "draft", "verify", "sync", "other", "queued", "transport"), 0.0
        )
    )

    def add(self, event: RoundEvent) -> None:
        """Count one step."""
        self.times_ms["transport"] += event.transport_ms
        self.times_ms["queued"] += event.queued_ms
        self.resumes += event.resumes
        self.feature_bytes += event.feature_bytes
        if event.prefill:
            self.times_ms["prefill"] += event.compute_ms
            self.prefill_batch_size = event.batch_size
            return
        self.times_ms["draft"] += event.draft_ms
        self.times_ms["verify"] += event.verify_ms
        self.times_ms["sync"] += event.sync_ms
        self.times_ms["other"] += event.other_ms
        self.rounds += 1
        self.pre_drafted += event.pre_drafted
        self.batch_size_sum += event.batch_size
        self.proposed += event.proposed
        self.accepted += event.accepted
        self.emitted += len(event.tokens)

    def summary(self) -> SpecStats:
        """The `usage.speculative` block: tokens per round = emitted tokens / rounds."""
        t = self.times_ms
        return SpecStats(
            method=self.method, synthetic=self.synthetic, temperature=self.temperature,
            rounds=self.rounds, pre_drafted_rounds=self.pre_drafted, proposed_tokens=self.proposed,
            accepted_tokens=self.accepted,
            tokens_per_round=round(self.emitted / self.rounds, 4) if self.rounds else 0.0,
            acceptance_rate=round(self.accepted / self.proposed, 4) if self.proposed else 0.0,
            prefill_ms=round(t["prefill"], 3), draft_ms=round(t["draft"], 3),
            verify_ms=round(t["verify"], 3), sync_ms=round(t["sync"], 3),
            other_ms=round(t["other"], 3), queued_ms=round(t["queued"], 3),
            transport_ms=round(t["transport"], 3),
            resumes=self.resumes, feature_bytes=self.feature_bytes,
            mean_batch_size=round(self.batch_size_sum / self.rounds, 4) if self.rounds else 0.0,
            prefill_batch_size=self.prefill_batch_size,
        )
