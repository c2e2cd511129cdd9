#!/bin/sh
# gpuevents Slurm prolog: writes the job's GPUs to the HPC job mapping directory, in dcgm-exporter's
# --hpc-job-mapping-dir format (one file per GPU index, holding the ids of the jobs on that GPU, one a line),
# so the agent (agent.hpc_job_mapping_dir) sees a GPU allocated to a job even with no process on it; and the
# job's details beside it, in `.jobs/<id>` (`key=value` lines: user, uid, account, partition, name,
# started_at), so the agent knows whose job it is without asking slurmctld. What a prolog's environment
# lacks (QOS, time limit) the agent reads once per job with `scontrol show job -o ID`.
# A site that already runs dcgm-exporter's prolog can point the agent at the same directory.
#
# slurm.conf:  Prolog=/etc/gpuevents/slurm/prolog.sh  Epilog=/etc/gpuevents/slurm/epilog.sh
# Environment: SLURM_JOB_ID and SLURM_JOB_GPUS (the GPU indexes, comma-separated), SLURM_JOB_USER,
# SLURM_JOB_UID, SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION, SLURM_JOB_NAME, as slurmd gives a prolog;
# GPUEVENTS_JOB_MAP_DIR overrides the directory. Ids must be digits; another value is written only when it
# is all letters, digits and `._@+-` (else left empty, for the agent to read from squeue), at most 128
# characters: nothing from the environment reaches a shell or a path.
set -eu
dir="${GPUEVENTS_JOB_MAP_DIR:-/var/run/gpuevents-job-map}"
job="${SLURM_JOB_ID:-}"
gpus="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
case "$job" in ''|*[!0-9]*) exit 0 ;; esac      # not a job id: nothing to write
mkdir -p "$dir/.jobs"

clean() {  # a value from the environment, kept only when it is all safe characters (else left empty)
  case "$1" in *[!A-Za-z0-9._@+-]*) ;; *) printf '%s' "$1" | cut -c1-128 ;; esac
}
uid="${SLURM_JOB_UID:-}"
case "$uid" in *[!0-9]*) uid="" ;; esac
details="$dir/.jobs/.$job.$$"
{
  echo "id=$job"
  echo "user=$(clean "${SLURM_JOB_USER:-}")"
  echo "uid=$uid"
  echo "account=$(clean "${SLURM_JOB_ACCOUNT:-}")"
  echo "partition=$(clean "${SLURM_JOB_PARTITION:-}")"
  echo "name=$(clean "${SLURM_JOB_NAME:-}")"
  echo "started_at=$(date +%s)"
} > "$details"
mv -f "$details" "$dir/.jobs/$job"

IFS=,
for gpu in $gpus; do
  case "$gpu" in ''|*[!0-9]*) continue ;; esac  # a GPU index is digits only
  tmp="$dir/.$gpu.$job.$$"
  { [ -f "$dir/$gpu" ] && grep -vx "$job" "$dir/$gpu" || true; echo "$job"; } > "$tmp"
  mv -f "$tmp" "$dir/$gpu"
done
exit 0
