"""docs/deploy.md refers to files that exist and to names the manifests really use."""

from __future__ import annotations

import re

from tests.deploy.conftest import REPO

DOC = (REPO / "docs" / "deploy.md").read_text()


def test_every_repository_path_in_the_guide_exists() -> None:
    paths = set(re.findall(r"((?:deploy|tests|docs)/[\w./@-]+|Dockerfile|config\.example\.yaml)", DOC))
    # `kubectl exec deploy/gpuevents-engine` names a Deployment, not a path
    paths = {p.rstrip(".") for p in paths if not p.startswith("deploy/gpuevents-")}
    assert len(paths) > 10
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, missing


def test_the_guide_names_the_secrets_and_services_the_manifests_use() -> None:
    for name in ("gpuevents-agent-nats", "gpuevents-engine", "nats-gpuevents-auth", "gpuevents-slack",
                 "nats://nats.nats.svc:4222", "statefulset/nats", "daemonset/gpuevents-agent",
                 "deployment/gpuevents-engine"):
        assert name in DOC, name
    manifests = "".join(p.read_text() for p in (REPO / "deploy" / "kubernetes").glob("*.yaml"))
    for name in ("gpuevents-agent-nats", "gpuevents-slack", "nats://nats.nats.svc:4222"):
        assert name in manifests, name
