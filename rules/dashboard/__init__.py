"""The live dashboard: its pages and JSON API, the fleet view, the heatmap timeline and `free`."""
