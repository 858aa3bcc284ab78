"""Config loading in one place: `load_config(path)` gives a validated, immutable `Config`."""

from kvmigrate.config.errors import ConfigError
from kvmigrate.config.loader import default_config_path, load_config, parse_config
from kvmigrate.config.model import (
    BackendConfig,
    Config,
    ModelRoute,
    NotDirect,
    RecordConfig,
    RolloutConfig,
    ServerConfig,
)
from kvmigrate.config.schema import config_keys
from kvmigrate.config.secret import Secret, safe_text, safe_url

__all__ = [
    "BackendConfig",
    "Config",
    "ConfigError",
    "ModelRoute",
    "NotDirect",
    "RecordConfig",
    "RolloutConfig",
    "Secret",
    "ServerConfig",
    "config_keys",
    "default_config_path",
    "load_config",
    "parse_config",
    "safe_text",
    "safe_url",
]
