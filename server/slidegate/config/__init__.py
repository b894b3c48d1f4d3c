"""Rate-limit configuration: the YAML format of envoyproxy/ratelimit, loaded into an immutable model."""

from slidegate.config.builder import LoadOptions
from slidegate.config.errors import ConfigError, ConfigIssue
from slidegate.config.loader import load_directory, load_file
from slidegate.config.model import Config, DescriptorNode, DomainConfig, Level, Match, RateLimit

__all__ = [
    "Config",
    "ConfigError",
    "ConfigIssue",
    "DescriptorNode",
    "DomainConfig",
    "Level",
    "LoadOptions",
    "Match",
    "RateLimit",
    "load_directory",
    "load_file",
]
