"""Config schemas, their registration in Hydra's ConfigStore, and semantic validation."""

from k25exp.config.store import register_configs

__all__ = ["register_configs"]
