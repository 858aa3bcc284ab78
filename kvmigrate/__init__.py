"""kvmigrate: move LLM agent traffic from hosted APIs to self-hosted vLLM, step by step."""

__version__ = "0.1.0"
