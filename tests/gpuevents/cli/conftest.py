"""The command line's tests run an engine like the engine's tests do: the same fixtures."""

from tests.rules.engine.conftest import engine_config, rules_dir

__all__ = ["engine_config", "rules_dir"]
