"""Real engines for tests, the demo and benchmarks, never for serving.

A vLLM (CPU build): its venv, a tiny model, a server. A LiteLLM proxy with the kvmigrate
plugin loaded: its venv (`litellm_venv`) and process (`litellm_process`).

This package must stay importable without vLLM, torch or litellm: the heavy parts live in
separate venvs (see `vllm_venv`, `litellm_venv`) and run as child processes. Keep this
`__init__` free of imports, because `tiny_model` is also run inside the vLLM venv, where the
project's dependencies are absent.
"""
