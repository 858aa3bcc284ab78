"""The OpenAI-compatible proxy: the hot path, bytes in and bytes out."""

from kvmigrate.proxy.app import build_proxy_app
from kvmigrate.proxy.service import ProxyService, RolloutSource, StaticRollout

__all__ = ["ProxyService", "RolloutSource", "StaticRollout", "build_proxy_app"]
