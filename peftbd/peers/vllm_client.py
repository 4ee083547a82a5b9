"""`VllmPeer`: a vLLM engine in its side process (`peftbd.peers.vllm_side`), driven over the typed
line protocol. A context manager: the process starts on enter and stops on exit; a request that
failed there raises `VllmError` here with its message (the side's traceback is kept on it). The
process starts as vLLM's CPU guide says (`vllm_env.vllm_environment`)."""

from __future__ import annotations

import os
import subprocess
from types import TracebackType

from peftbd.peers.vllm_env import REPO, vllm_environment, vllm_python
from peftbd.peers.vllm_protocol import (
    REPLY,
    REQUEST,
    Failed,
    Generate,
    Generated,
    Load,
    Ready,
    Request,
    Stop,
)


class VllmError(RuntimeError):
    """A request failed in the vLLM side process."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(f"vLLM side process: {failed.error}")
        self.side_traceback = failed.traceback


class VllmPeer:
    """One vLLM side process; `load` an engine, then `generate` on it as often as needed."""

    def __init__(self, log_path: str | os.PathLike[str] | None = None) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.ready: Ready | None = None

    def __enter__(self) -> VllmPeer:
        env = {**os.environ, **vllm_environment(1), "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}  # its Load sets the threads
        with open(self.log_path or os.devnull, "a") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen([str(vllm_python()), "-m", "peftbd.peers.vllm_side"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         text=True, env=env, cwd=REPO)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write(REQUEST.dump_json(Stop()).decode() + "\n")
                proc.stdin.flush()
            proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def _ask(self, request: Request) -> Ready | Generated:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise RuntimeError("VllmPeer is used outside its `with` block")
        proc.stdin.write(REQUEST.dump_json(request).decode() + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            where = f" (its log: {self.log_path})" if self.log_path else ""
            raise VllmError(Failed(error=f"exited with status {proc.wait()} before answering{where}"))
        reply = REPLY.validate_json(line)
        if isinstance(reply, Failed):
            raise VllmError(reply)
        return reply

    def load(self, request: Load) -> Ready:
        ready = self._ask(request)
        assert isinstance(ready, Ready), ready
        self.ready = ready
        return ready

    def generate(self, request: Generate) -> Generated:
        out = self._ask(request)
        assert isinstance(out, Generated), out
        return out
