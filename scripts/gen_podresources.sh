#!/bin/sh
# Regenerate agent/podresources/api_pb2.py(i) and api_grpc.py from the kubelet's own api.proto.
# Needs grpcio-tools and grpclib (its protoc-gen-grpclib_python plugin) in the Python that runs it;
# neither is a dependency of gpuevents at run time (grpclib is, grpcio is not).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PLUGIN=$(dirname "$(command -v "$PY")")/protoc-gen-grpclib_python
"$PY" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpclib_python_out=. \
    --plugin=protoc-gen-grpclib_python="$PLUGIN" agent/podresources/api.proto
