"""The OpenAI-compatible proxy: the hot path, bytes in and bytes out."""

from kvmigrate.proxy.app import build_proxy_app
from kvmigrate.proxy.rollout_source import RolloutSource, StaticRollout
from kvmigrate.proxy.service import ProxyService

__all__ = ["ProxyService", "RolloutSource", "StaticRollout", "build_proxy_app"]
