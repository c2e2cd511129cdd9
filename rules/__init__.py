"""The rules engine: YAML rules, fast conditions, entity state, incidents, and the pure core that runs them."""
