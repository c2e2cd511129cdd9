"""The built-in actions; each module registers one or two action types."""
