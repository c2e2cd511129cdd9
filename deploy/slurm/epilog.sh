#!/bin/sh
# gpuevents Slurm epilog: removes the job from the HPC job mapping directory (see prolog.sh); a GPU's file goes
# when no job is left on it, and the job's details file (`.jobs/<id>`) with it.
set -eu
dir="${GPUEVENTS_JOB_MAP_DIR:-/var/run/gpuevents-job-map}"
job="${SLURM_JOB_ID:-}"
case "$job" in ''|*[!0-9]*) exit 0 ;; esac
[ -d "$dir" ] || exit 0
rm -f "$dir/.jobs/$job"
for f in "$dir"/*; do
  [ -f "$f" ] || continue
  name="${f##*/}"
  case "$name" in ''|*[!0-9.]*) continue ;; esac
  if grep -qx "$job" "$f"; then
    rest="$(grep -vx "$job" "$f" || true)"
    if [ -z "$rest" ]; then rm -f "$f"; else printf '%s\n' "$rest" > "$f.tmp.$$" && mv -f "$f.tmp.$$" "$f"; fi
  fi
done
exit 0
