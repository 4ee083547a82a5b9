"""Peer engines measured beside ours: vLLM, run in its own Python environment (see
`peftbd.peers.vllm_env`) and driven over a typed line protocol (`peftbd.peers.vllm_protocol`)."""
