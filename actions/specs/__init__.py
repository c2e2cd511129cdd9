"""The light half of each built-in action: its parameters and nature, all `rules check` needs (no clients)."""
