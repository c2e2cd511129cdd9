#!/bin/sh
# Entrypoint of the gpuevents image: `gpuevents "$@"`, after reading the NATS password from the
# file NATS_PASSWORD_FILE names, if it is set (the agent DaemonSet points it at the key named after
# its node in the Secret gpuevents-agent-nats; gpuevents.bus reads NATS_PASSWORD from the environment).
set -eu
if [ -n "${NATS_PASSWORD_FILE:-}" ]; then
  if [ ! -r "$NATS_PASSWORD_FILE" ]; then
    echo "gpuevents: no NATS password at $NATS_PASSWORD_FILE (NATS_PASSWORD_FILE)." >&2
    echo "gpuevents: is this node in the Secret? Rerun deploy/nats/nats_auth.py with it and apply its kubernetes-secrets.yaml." >&2
    exit 78  # EX_CONFIG
  fi
  NATS_PASSWORD=$(cat "$NATS_PASSWORD_FILE")
  export NATS_PASSWORD
  unset NATS_PASSWORD_FILE
fi
exec gpuevents "$@"
