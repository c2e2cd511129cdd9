"""The site's own past brought into the usage store (`gpuevents import`): dcgm-exporter's series from Prometheus,
jobs from Slurm's accounting."""
