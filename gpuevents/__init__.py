"""gpuevents: the shared contract — events, subjects, bus, configuration, clock, command line."""

__version__ = "0.1.0"
