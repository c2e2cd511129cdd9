"""Read-only GETs against the Kubernetes API for the agent, over aiohttp (which nats-py loads anyway): the agent
reads its Node and pods' owners without lightkube and its HTTP stack (~4 MiB). In-cluster (the service account's
token, read again before each request as it rotates, and CA), or a kubeconfig whose credentials are a token,
token file or client certificate; a kubeconfig that needs more (exec or auth-provider plugins) is Unsupported and
the caller uses lightkube."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from gpuevents.config import KubernetesConfig

if TYPE_CHECKING:
    import aiohttp

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Unsupported(Exception):
    """This configuration needs what only lightkube does (credential plugins)."""


class KubeReadError(Exception):
    """The API answered with an error (`code`), or could not be reached (`code` None)."""

    def __init__(self, message: str, code: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


def _data_file(data: str, suffix: str) -> str:
    """A kubeconfig's *-data as a private file (ssl loads certificates from files)."""
    fd, name = tempfile.mkstemp(prefix="gpuevents-kube-", suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return name


class KubeReader:
    """GET `path` as JSON; None for a 404. One aiohttp session, opened on first use."""

    def __init__(self, server: str, tls: ssl.SSLContext | bool, token: str | None = None,
                 token_file: Path | None = None, timeout_s: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.tls = tls
        self.token = token
        self.token_file = token_file
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_config(cls, cfg: KubernetesConfig) -> KubeReader:
        """As lightkube would read `cfg`: a kubeconfig file, else in-cluster, else $KUBECONFIG / ~/.kube/config."""
        if cfg.kubeconfig is not None:
            return cls._from_kubeconfig(cfg.kubeconfig, cfg.context)
        if cfg.in_cluster or (cfg.in_cluster is None and os.environ.get("KUBERNETES_SERVICE_HOST")):
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise Unsupported("in_cluster is set but KUBERNETES_SERVICE_HOST is not")
            tls = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))
            return cls(f"https://{host}:{port}", tls, token_file=SA_DIR / "token")
        env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
        return cls._from_kubeconfig(Path(env), cfg.context)

    @classmethod
    def _from_kubeconfig(cls, path: Path, context: str | None) -> KubeReader:
        try:
            doc: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise Unsupported(f"kubeconfig {path}: {e}") from None
        by = {k: {i["name"]: i.get(k.rstrip("s"), {}) for i in doc.get(k) or []}
              for k in ("clusters", "users", "contexts")}
        ctx = by["contexts"].get(context or doc.get("current-context", ""))
        if ctx is None:
            raise Unsupported(f"kubeconfig {path}: no context {context or doc.get('current-context')!r}")
        cluster = by["clusters"].get(ctx.get("cluster", ""), {})
        user = by["users"].get(ctx.get("user", ""), {})
        if "exec" in user or "auth-provider" in user:
            raise Unsupported("the kubeconfig's user needs a credential plugin")
        tls: ssl.SSLContext | bool = True
        if cluster.get("insecure-skip-tls-verify"):
            tls = False
        else:
            ca = cluster.get("certificate-authority") or (
                _data_file(cluster["certificate-authority-data"], ".crt") if cluster.get(
                    "certificate-authority-data") else None)
            tls = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
        cert = user.get("client-certificate") or (
            _data_file(user["client-certificate-data"], ".crt") if user.get("client-certificate-data") else None)
        key = user.get("client-key") or (
            _data_file(user["client-key-data"], ".key") if user.get("client-key-data") else None)
        if cert and key:
            if not isinstance(tls, ssl.SSLContext):
                tls = ssl.create_default_context()
                tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
            tls.load_cert_chain(cert, key)
        token_file = Path(user["tokenFile"]) if user.get("tokenFile") else None
        return cls(cluster.get("server", ""), tls, token=user.get("token"), token_file=token_file)

    def _headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip() or token
            except OSError:
                pass
        return {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}

    async def get(self, path: str) -> dict[str, Any] | None:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.get(self.server + path, headers=self._headers(), ssl=self.tls) as resp:
                body = await resp.read()
                if resp.status == 404:
                    return None
                if resp.status >= 400:
                    try:
                        status = orjson.loads(body)
                    except orjson.JSONDecodeError:
                        status = {}
                    status = status if isinstance(status, dict) else {}
                    raise KubeReadError(str(status.get("message") or resp.reason), resp.status,
                                        str(status.get("reason") or ""))
                out: dict[str, Any] = orjson.loads(body)
                return out
        except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as e:
            raise KubeReadError(f"{type(e).__name__}: {e}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def object_path(group: str, version: str, plural: str, namespace: str, name: str) -> str:
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return f"{base}/namespaces/{namespace}/{plural}/{name}" if namespace else f"{base}/{plural}/{name}"
