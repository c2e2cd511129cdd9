"""A real Kubernetes control plane on loopback for tests: etcd, kube-apiserver, controllers, scheduler, kwok.

The fixture `kube_cluster` (session-scoped: every test uses names or a namespace of its own) yields a
`KubeCluster`:

- `kubeconfig`: an admin kubeconfig (a client certificate in `system:masters`), for code under test;
- `client()` / `sync_client()`: a lightkube client as that admin (the caller closes it);
- `namespace(prefix)`: creates a fresh namespace and returns its name;
- `service_account_kubeconfig(ns, name)` / `service_account_client(ns, name)`: a kubeconfig / AsyncClient
  acting as that ServiceAccount (created if missing), with a TokenRequest token: for RBAC checks;
- `add_gpu_node(name, gpus=8, labels=...)`: a node kwok keeps Ready, with `nvidia.com/gpu` capacity, so the
  scheduler places pods of Deployments and Jobs on it and kwok marks them Running (they never complete);
- `wait(condition, timeout, what)`: poll a condition with a deadline.

Binaries come from `scripts/k8s-test-tools.sh` (its cache, or `$GPUEVENTS_K8S_BIN`); without them the fixture
fails saying how to build them: tests of the control plane never skip. The API server runs RBAC and Node
authorization; the ServiceAccount and TaintNodesByCondition admission plugins are off (ADMISSION_OFF says why).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.core_v1 import NodeSpec, NodeStatus
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, ServiceAccount, ServiceAccountToken

from gpuevents.server import free_port

T = TypeVar("T")


class _HasMeta(Protocol):
    @property
    def metadata(self) -> ObjectMeta | None: ...


def meta(obj: _HasMeta) -> ObjectMeta:
    """An object's metadata, which the API server always fills in (lightkube's models type it optional)."""
    assert obj.metadata is not None, obj
    return obj.metadata


def name_of(obj: _HasMeta) -> str:
    """An object's name, which the API server always has."""
    name = meta(obj).name
    assert name is not None, obj
    return name
ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "scripts" / "k8s-test-tools.sh"
STAGES = Path(__file__).resolve().parent / "kwok-stages.yaml"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
CONTROLLERS = ("replicaset-controller", "deployment-controller", "statefulset-controller",
               "daemonset-controller", "job-controller", "cronjob-controller", "garbage-collector-controller",
               "namespace-controller", "serviceaccount-controller", "disruption-controller",
               "clusterrole-aggregation-controller", "pod-garbage-collector-controller")
# ServiceAccount: nothing here mounts a token into a fake pod; TaintNodesByCondition: it taints every new node
# not-ready until the node-lifecycle controller, which kwok's fake heartbeats would not satisfy, lifts it.
ADMISSION_OFF = ("ServiceAccount", "TaintNodesByCondition")
START_TIMEOUT_S = 90.0


def bin_dir() -> Path:
    """Where scripts/k8s-test-tools.sh puts (or put) the binaries."""
    if env := os.environ.get("GPUEVENTS_K8S_BIN"):
        return Path(env)
    out = subprocess.run([str(TOOLS), "--bin-dir"], check=True, capture_output=True, text=True, timeout=10)
    return Path(out.stdout.strip())


def missing_binaries(where: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(where / b, os.X_OK)]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(d: Path) -> None:
    """A CA, the API server's serving certificate, an admin client certificate, the service-account key."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=gpuevents-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)
    for name, subj, ext in (
        ("server", "/CN=kube-apiserver", ["subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc",
                                          "extendedKeyUsage=serverAuth"]),
        ("admin", "/O=system:masters/CN=gpuevents-test-admin", ["extendedKeyUsage=clientAuth"]),
    ):
        _openssl("req", "-x509", *ec, "-CA", "ca.crt", "-CAkey", "ca.key", "-keyout", f"{name}.key",
                 "-out", f"{name}.crt", "-subj", subj, *itertools.chain.from_iterable(("-addext", e) for e in ext),
                 "-addext", "basicConstraints=CA:FALSE", cwd=d)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=d)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def write_kubeconfig(path: Path, server: str, ca: Path, user: dict[str, str], namespace: str = "default") -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "u", "namespace": namespace}}],
    }))
    return path


@dataclass
class KubeCluster:
    root: Path
    bin: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_port: int = 0
    start_seconds: float = 0.0
    _names: Iterator[int] = field(default_factory=itertools.count)

    @property
    def certs(self) -> Path:
        return self.root / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    # -- clients and helpers for tests

    def client(self) -> AsyncClient:
        return AsyncClient(config=KubeConfig.from_file(self.kubeconfig), field_manager="tests", trust_env=False)

    def sync_client(self) -> Client:
        return Client(config=KubeConfig.from_file(self.kubeconfig), field_manager="tests", trust_env=False)

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{os.getpid()}-{next(self._names)}"

    def namespace(self, prefix: str = "t") -> str:
        name = self.unique(prefix)
        with contextlib.closing(self.sync_client()) as c:
            c.create(Namespace(metadata=ObjectMeta(name=name)))
        return name

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        with contextlib.closing(self.sync_client()) as c:
            with contextlib.suppress(Exception):  # already there: fine; any other failure shows below
                c.create(ServiceAccount(metadata=ObjectMeta(name=name, namespace=namespace)))
            token = c.create(ServiceAccountToken(metadata=ObjectMeta(name=name, namespace=namespace),
                                                 spec=TokenRequestSpec(audiences=[], expirationSeconds=3600)),
                             name, namespace=namespace)
        assert token.status is not None and token.status.token is not None
        return write_kubeconfig(self.root / f"sa-{namespace}-{name}.kubeconfig", self.server,
                                self.certs / "ca.crt", {"token": token.status.token}, namespace)

    def service_account_client(self, namespace: str, name: str) -> AsyncClient:
        path = self.service_account_kubeconfig(namespace, name)
        return AsyncClient(config=KubeConfig.from_file(path), field_manager="tests", trust_env=False)

    def add_gpu_node(self, name: str, gpus: int = 8, labels: dict[str, str] | None = None,
                     unschedulable: bool = False, timeout: float = 30.0) -> Node:
        """A fake node managed by kwok, returned once Ready."""
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        node = Node(metadata=ObjectMeta(name=name, annotations={KWOK_ANNOTATION: "fake"},
                                        labels={"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})}),
                    spec=NodeSpec(unschedulable=unschedulable or None),
                    status=NodeStatus(capacity=capacity, allocatable=capacity))
        with contextlib.closing(self.sync_client()) as c:
            c.create(node)

            def ready() -> Node | None:
                got = c.get(Node, name)
                conds = (got.status.conditions if got.status else None) or []
                return got if any(x.type == "Ready" and x.status == "True" for x in conds) else None

            return self.wait(ready, timeout, f"node {name} Ready (kwok)")

    def wait(self, condition: Callable[[], T | None], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.05) -> T:
        """Poll `condition` until it returns something truthy; fail after `timeout` (daemons that died say so)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            self._check_alive()
            try:
                result = condition()
                if result:
                    return result
                last = result
            except Exception as e:  # not yet: a daemon still starting
                last = e
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last: {last!r}\n{self.logs()}")
            time.sleep(interval)

    # -- the daemons

    def start(self) -> KubeCluster:
        started = time.monotonic()
        make_certificates(self.certs)
        etcd_port, peer_port, self.api_port = free_port(), free_port(), free_port()
        etcd = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            "--name", "test", "--data-dir", str(self.root / "etcd"), "--unsafe-no-fsync",
            "--listen-client-urls", etcd, "--advertise-client-urls", etcd,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"test=http://127.0.0.1:{peer_port}", "--log-level", "warn"])
        self.wait(lambda: json.loads(urllib.request.urlopen(f"{etcd}/health", timeout=2).read())["health"] == "true",
                  START_TIMEOUT_S, "etcd healthy")
        c = self.certs
        self._spawn("kube-apiserver", [
            "--etcd-servers", etcd, "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.api_port), "--cert-dir", str(self.root / "apiserver"),
            "--tls-cert-file", str(c / "server.crt"), "--tls-private-key-file", str(c / "server.key"),
            "--client-ca-file", str(c / "ca.crt"),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(c / "sa.pub"),
            "--service-account-signing-key-file", str(c / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/16", "--authorization-mode", "Node,RBAC",
            "--disable-admission-plugins", ",".join(ADMISSION_OFF), "--endpoint-reconciler-type", "none",
            "--profiling=false", "--v=0"])
        write_kubeconfig(self.kubeconfig, self.server, c / "ca.crt",
                         {"client-certificate": str(c / "admin.crt"), "client-key": str(c / "admin.key")})
        tls = ssl.create_default_context(cafile=str(c / "ca.crt"))
        tls.load_cert_chain(str(c / "admin.crt"), str(c / "admin.key"))
        self.wait(lambda: urllib.request.urlopen(f"{self.server}/readyz", context=tls, timeout=5).status == 200,
                  START_TIMEOUT_S, "kube-apiserver /readyz")
        kc = str(self.kubeconfig)
        self._spawn("kube-controller-manager", [
            "--kubeconfig", kc, "--leader-elect=false", "--secure-port=0", "--controllers", ",".join(CONTROLLERS),
            "--root-ca-file", str(c / "ca.crt"), "--profiling=false", "--v=0"])
        self._spawn("kube-scheduler", ["--kubeconfig", kc, "--leader-elect=false", "--secure-port=0",
                                       "--profiling=false", "--v=0"])
        self._spawn("kwok", ["--kubeconfig", kc, "--config", str(STAGES), "--manage-all-nodes=false",
                             f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                             "--node-ip", "127.0.0.1", "--cidr", "10.244.0.1/16"])
        with contextlib.closing(self.sync_client()) as client:  # the controller-manager is at work
            self.wait(lambda: client.get(ServiceAccount, "default", namespace="default"), START_TIMEOUT_S,
                      "the default ServiceAccount (kube-controller-manager)")
        self.start_seconds = time.monotonic() - started
        return self

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen([str(self.bin / name), *args], stdout=log, stderr=log,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log(name)}")

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {n}.log\n{self.log(n, 1500)}" for n in self.procs)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            p = self.procs.pop(name)
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A running Kubernetes control plane shared by the session's tests."""
    where = bin_dir()
    missing = missing_binaries(where)
    if missing:
        pytest.fail(f"the Kubernetes test binaries are not built ({', '.join(missing)} missing in {where}): "
                    f"run scripts/k8s-test-tools.sh (.ci/run does), or set GPUEVENTS_K8S_BIN", pytrace=False)
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), where)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
