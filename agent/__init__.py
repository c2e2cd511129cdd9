"""The node agent: samples GPUs (NVML or simulated), attributes processes, applies edge thresholds, publishes events."""
