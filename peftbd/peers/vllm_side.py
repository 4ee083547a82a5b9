"""The vLLM side process: `<vLLM env python> -m peftbd.peers.vllm_side`, started by
`peftbd.peers.vllm_client.VllmPeer`. It reads one `vllm_protocol` request a line from stdin and
answers each with one reply line on stdout (vLLM's own logs go to stderr). It runs in vLLM's
environment (`scripts/install.sh --with-vllm`), so it imports nothing of this project but the
protocol.

The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and is stepped here, so a
generate call is timed from its first request added to its last finished, and its steps counted.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from peftbd.peers.vllm_protocol import REPLY, REQUEST, Failed, Generate, Generated, Load, Ready, Stop


def configure_environment(threads: int) -> None:
    """Before vLLM is imported: the engine in this process, `threads` OpenMP threads, no
    pinning (the box is shared with our engine, which pins nothing either), quiet logs."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


class Side:
    """One engine for the process's life: a second `load` is refused (vLLM's process-wide
    state, its compiled kernels' registry among it, does not survive a second engine)."""

    def __init__(self) -> None:
        self.llm = None
        self.speculative = False

    def load(self, req: Load) -> Ready:
        configure_environment(req.threads)
        import torch
        import vllm

        if self.llm is not None:
            raise RuntimeError("this side process has an engine already: start another VllmPeer")
        torch.set_num_threads(req.threads)
        speculative = None
        if req.ngram is not None:
            speculative = {"method": "ngram", "num_speculative_tokens": req.ngram.num_tokens,
                           "prompt_lookup_min": req.ngram.min_ngram,
                           "prompt_lookup_max": req.ngram.max_ngram}
        elif req.dflash_drafter is not None:
            speculative = {"method": "dflash", "model": req.dflash_drafter.model_dir,
                           "num_speculative_tokens": req.dflash_drafter.num_tokens}
        start = time.perf_counter()
        self.speculative = speculative is not None
        self.llm = vllm.LLM(
            model=req.model_dir, dtype=req.dtype, max_model_len=req.max_model_len,
            max_num_seqs=req.max_num_seqs, max_num_batched_tokens=max(req.max_model_len, 2048),
            gpu_memory_utilization=req.memory_share, seed=req.seed, skip_tokenizer_init=True,
            speculative_config=speculative, enforce_eager=req.enforce_eager,
            enable_prefix_caching=False, disable_log_stats=not self.speculative)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return Ready(vllm_version=vllm.__version__, device=device,
                     load_s=round(time.perf_counter() - start, 3))

    def generate(self, req: Generate) -> Generated:
        from vllm import SamplingParams, TokensPrompt

        if self.llm is None:
            raise RuntimeError("generate before load: send a load request first")
        engine = self.llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=req.max_tokens,
                                stop_token_ids=req.stop_token_ids, detokenize=False)
        outputs: dict[int, list[int]] = {}
        steps = request_steps = 0
        before = self.accepted_per_position()
        start = time.perf_counter()
        for i, ids in enumerate(req.prompts):
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=ids), params)
        while engine.has_unfinished_requests():
            stepped = engine.step()
            steps += 1
            request_steps += len(stepped)
            for out in stepped:
                if out.finished:
                    outputs[int(out.request_id)] = list(out.outputs[0].token_ids)
        seconds = time.perf_counter() - start
        after = self.accepted_per_position()
        accepted = None if after is None or before is None else [a - b for a, b in zip(after, before)]
        return Generated(outputs=[outputs[i] for i in range(len(req.prompts))],
                         seconds=round(seconds, 6), steps=steps, request_steps=request_steps,
                         accepted_per_position=accepted)

    def accepted_per_position(self) -> list[int] | None:
        """vLLM's count so far of draft tokens accepted at each draft position; None without a
        speculative method (its stats are off then)."""
        from vllm.v1.metrics.reader import Vector

        if self.llm is None or not self.speculative:
            return None
        found = next((m for m in self.llm.get_metrics()
                      if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"), None)
        return list(found.values) if isinstance(found, Vector) else None


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")  # the protocol's own stdout;
    os.dup2(2, 1)  # whatever vLLM prints goes to stderr
    side = Side()
    for line in sys.stdin:
        if not line.strip():
            continue
        reply: Ready | Generated | Failed
        try:
            req = REQUEST.validate_json(line)
            if isinstance(req, Stop):
                break
            reply = side.load(req) if isinstance(req, Load) else side.generate(req)
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller as a reply
            reply = Failed(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            print(traceback.format_exc(), file=sys.stderr, flush=True)  # the caller's log file too
        replies.write(REPLY.dump_json(reply).decode() + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
