"""Helpers for the Kubernetes action tests: a runner on a kubeconfig, GPU pod specs and templates, waiting
for running pods."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from lightkube import AsyncClient
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import ReplicaSet
from lightkube.resources.core_v1 import Pod

from actions.runner import ActionRunner
from tests.actions.conftest import make_config


async def runner_for(kubeconfig: Path) -> ActionRunner:
    return await ActionRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(kubeconfig)}}))


def gpu_pod_spec(node: str | None = None) -> PodSpec:
    return PodSpec(nodeName=node, containers=[Container(
        name="train", image="trainer:1", resources=ResourceRequirements(limits={"nvidia.com/gpu": "1"}))])


def gpu_pod_template(app: str) -> PodTemplateSpec:
    return PodTemplateSpec(metadata=ObjectMeta(labels={"app": app}), spec=gpu_pod_spec())


async def replica_sets_of(client: AsyncClient, namespace: str, app: str) -> list[ReplicaSet]:
    return [rs async for rs in client.list(ReplicaSet, namespace=namespace, labels={"app": app})]


async def running_pods(client: AsyncClient, namespace: str, app: str) -> int:
    return len([p async for p in client.list(Pod, namespace=namespace, labels={"app": app})
                if p.status is not None and p.status.phase == "Running" and p.metadata is not None
                and p.metadata.deletionTimestamp is None])


def running(client: AsyncClient, namespace: str, app: str, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await running_pods(client, namespace, app) == n
    return check
