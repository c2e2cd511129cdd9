#!/usr/bin/env bash
# Builds, once per machine, the Kubernetes control-plane binaries the tests run (docs/kubernetes.md).
#
#   scripts/k8s-test-tools.sh            build what is missing, print the bin directory
#   scripts/k8s-test-tools.sh --bin-dir  print the bin directory only (builds nothing)
#
# Binaries: kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3),
# kwok (sigs.k8s.io/kwok) and helm (helm.sh/helm/v3), built from the Go module proxy into
# ${GPUEVENTS_K8S_CACHE:-/var/cache/gpuevents-k8s}/<kubernetes version>/bin. A binary is rebuilt only when
# its stamp (<name>.version beside it) does not name the wanted version, so a second run does nothing.
# Honours GOFLAGS (e.g. GOFLAGS=-p=2 on a shared machine) and GOTOOLCHAIN.
set -euo pipefail

K8S_VERSION="${GPUEVENTS_K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${GPUEVENTS_ETCD_VERSION:-v3.6.17}"
KWOK_VERSION="${GPUEVENTS_KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${GPUEVENTS_HELM_VERSION:-v3.22.0}"
CACHE="${GPUEVENTS_K8S_CACHE:-/var/cache/gpuevents-k8s}"
BIN="$CACHE/$K8S_VERSION/bin"

if [ "${1:-}" = "--bin-dir" ]; then
  echo "$BIN"
  exit 0
fi

fail() { echo "k8s-test-tools: $*" >&2; exit 1; }
command -v go >/dev/null 2>&1 || fail "no 'go' on PATH: install Go 1.26+ (https://go.dev/dl) to build the Kubernetes test binaries"
mkdir -p "$BIN" || fail "cannot create $BIN: set GPUEVENTS_K8S_CACHE to a writable directory"

fresh() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/$1.version" 2>/dev/null)" = "$2" ]; }

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=mod" GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

# build NAME VERSION MODULE@VER PACKAGE [LDFLAGS...] -- REPLACE-LINES on stdin: builds PACKAGE from a
# scratch module requiring MODULE@VER (a scratch module, because go install pkg@ver refuses modules whose
# go.mod carries replace directives, as k8s.io/kubernetes and etcd do).
build() {
  local name="$1" version="$2" require="$3" pkg="$4" ldflags="-s -w ${5:-}"
  local replaces; replaces="$(cat)"
  if fresh "$name" "$version"; then return 0; fi
  local scratch start
  scratch="$(mktemp -d)"; start=$(date +%s)
  echo "k8s-test-tools: building $name $version (cold builds take minutes)" >&2
  (
    cd "$scratch"
    printf 'module gpuevents.test/%s\n\ngo 1.26\n\nrequire %s %s\n%s\n' \
      "$name" "${require%@*}" "${require#*@}" "$replaces" >go.mod
    go build -trimpath -ldflags="$ldflags" -o "$BIN/$name.tmp" "$pkg"
  ) || { rm -rf "$scratch"; fail "building $name $version failed (see the go output above)"; }
  rm -rf "$scratch"
  mv "$BIN/$name.tmp" "$BIN/$name"
  echo "$version" >"$BIN/$name.version"
  echo "k8s-test-tools: built $name $version in $(( $(date +%s) - start )) s" >&2
}

# k8s.io/kubernetes requires its staging modules as v0.0.0 with replace => ./staging/...; a dependent
# module must replace each with its published v0.<minor>.<patch>.
k8s_replaces() {
  local gomod staging="v0.${K8S_VERSION#v1.}"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [ -n "$gomod" ] || fail "cannot download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy"
  sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod" |
    while read -r mod; do echo "replace $mod => $mod $staging"; done
}

need_k8s=0
for name in kube-apiserver kube-controller-manager kube-scheduler; do fresh "$name" "$K8S_VERSION" || need_k8s=1; done
if [ "$need_k8s" -eq 1 ]; then
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  vflags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  vflags="$vflags -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  vflags="$vflags -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  reps="$(k8s_replaces)"
  for name in kube-apiserver kube-controller-manager kube-scheduler; do
    build "$name" "$K8S_VERSION" "k8s.io/kubernetes@$K8S_VERSION" "k8s.io/kubernetes/cmd/$name" "$vflags" <<<"$reps"
  done
fi
build etcd "$ETCD_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" go.etcd.io/etcd/server/v3 </dev/null
build kwok "$KWOK_VERSION" "sigs.k8s.io/kwok@$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok </dev/null
# helm's default Kubernetes version (for kubeVersion checks in `helm template` and `helm lint`) is set at link
# time from the client-go it uses, as its Makefile does; unset, it is 1.20.
helm_gomod="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
[ -n "$helm_gomod" ] || fail "cannot download helm.sh/helm/v3@$HELM_VERSION from the Go module proxy"
helm_kube_minor="$(sed -n 's#^[[:space:]]*k8s\.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_gomod" | head -1)"
hflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  hflags="$hflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_kube_minor"
done
build helm "$HELM_VERSION (kubernetes 1.$helm_kube_minor)" "helm.sh/helm/v3@$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
  "$hflags" </dev/null

for name in kube-apiserver kube-controller-manager kube-scheduler etcd kwok helm; do
  fresh "$name" "$(cat "$BIN/$name.version" 2>/dev/null || echo none)" || fail "$BIN/$name is missing after the build"
done
echo "$BIN"
