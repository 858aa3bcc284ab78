"""A real vLLM (CPU build) for tests, the demo and benchmarks: its venv, a tiny model, a server.

This package must stay importable without vLLM or torch: the heavy parts live in a separate
venv (see `vllm_venv`) and run as child processes. Keep this `__init__` free of imports,
because `tiny_model` is also run inside that venv, where the project's dependencies are absent.
"""
