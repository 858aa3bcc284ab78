"""The exchange record, under the name the proxy's modules import it by."""

from kvmigrate.exchange import NOISE, SERVE, SHADOW, Exchange, Role

__all__ = ["NOISE", "SERVE", "SHADOW", "Exchange", "Role"]
