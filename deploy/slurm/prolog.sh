#!/bin/sh
# gpuevents Slurm prolog: writes the job's GPUs to the HPC job mapping directory, in dcgm-exporter's
# --hpc-job-mapping-dir format (one file per GPU index, holding the ids of the jobs on that GPU, one a line),
# so the agent (agent.hpc_job_mapping_dir) sees a GPU allocated to a job even with no process on it.
# A site that already runs dcgm-exporter's prolog needs nothing new: point the agent at the same directory.
#
# slurm.conf:  Prolog=/etc/gpuevents/slurm/prolog.sh  Epilog=/etc/gpuevents/slurm/epilog.sh
# Environment: SLURM_JOB_ID and SLURM_JOB_GPUS (the GPU indexes, comma-separated), as slurmd gives a prolog;
# GPUEVENTS_JOB_MAP_DIR overrides the directory. Only digits and commas are used from the environment.
set -eu
dir="${GPUEVENTS_JOB_MAP_DIR:-/var/run/gpuevents-job-map}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
case "$job" in ''|*[!0-9]*) exit 0 ;; esac      # not a job id: nothing to write
mkdir -p "$dir"
IFS=,
for gpu in $gpus; do
  case "$gpu" in ''|*[!0-9]*) continue ;; esac  # a GPU index is digits only
  tmp="$dir/.$gpu.$job.$$"
  { [ -f "$dir/$gpu" ] && grep -vx "$job" "$dir/$gpu" || true; echo "$job"; } > "$tmp"
  mv -f "$tmp" "$dir/$gpu"
done
exit 0
