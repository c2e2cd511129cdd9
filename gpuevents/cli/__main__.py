"""`python -m gpuevents.cli`: the command line."""

from gpuevents.cli import main

main()
