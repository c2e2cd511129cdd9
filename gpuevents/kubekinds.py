"""The Kubernetes workload kinds gpuevents knows: where each lives in the API, and how it is paused (stopped so
that its controller does not start it again) — shared by the agent's owner walk and the pause action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: how a kind is stopped: `replicas` (scale to 0, the count remembered), `suspend` (spec.suspend: true),
#: `run_policy` (spec.runPolicy.suspend: true, Kubeflow training jobs), `stop_annotation` (the Notebook's
#: kubeflow-resource-stopped), `min_replicas` (KServe: spec.predictor.minReplicas 0), None: not by itself
Pause = Literal["replicas", "suspend", "run_policy", "stop_annotation", "min_replicas"]

NOTEBOOK_STOP_ANNOTATION = "kubeflow-resource-stopped"


@dataclass(frozen=True, slots=True)
class Kind:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    pause: Pause | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: dict[str, Kind] = {k.kind: k for k in (
    Kind("", "v1", "Pod", "pods"),
    Kind("apps", "v1", "ReplicaSet", "replicasets", "replicas"),
    Kind("apps", "v1", "Deployment", "deployments", "replicas"),
    Kind("apps", "v1", "StatefulSet", "statefulsets", "replicas"),
    Kind("apps", "v1", "DaemonSet", "daemonsets"),
    Kind("batch", "v1", "Job", "jobs", "suspend"),
    Kind("batch", "v1", "CronJob", "cronjobs", "suspend"),
    Kind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", "suspend"),
    Kind("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets", "replicas"),
    Kind("ray.io", "v1", "RayCluster", "rayclusters", "suspend"),
    Kind("ray.io", "v1", "RayJob", "rayjobs", "suspend"),
    Kind("ray.io", "v1", "RayService", "rayservices"),
    Kind("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs", "run_policy"),
    Kind("kubeflow.org", "v1", "TFJob", "tfjobs", "run_policy"),
    Kind("kubeflow.org", "v1", "XGBoostJob", "xgboostjobs", "run_policy"),
    Kind("kubeflow.org", "v1", "PaddleJob", "paddlejobs", "run_policy"),
    Kind("kubeflow.org", "v1", "JAXJob", "jaxjobs", "run_policy"),
    Kind("kubeflow.org", "v2beta1", "MPIJob", "mpijobs", "run_policy"),
    Kind("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs", "suspend"),
    Kind("kubeflow.org", "v1", "Notebook", "notebooks", "stop_annotation"),
    Kind("serving.kserve.io", "v1beta1", "InferenceService", "inferenceservices", "min_replicas"),
    Kind("serving.knative.dev", "v1", "Revision", "revisions"),
    Kind("serving.knative.dev", "v1", "Configuration", "configurations"),
    Kind("serving.knative.dev", "v1", "Service", "services"),
)}


def kind_of(api_version: str, kind: str) -> Kind:
    """The table's entry for an ownerReference's apiVersion and kind; an unknown kind gets a guessed plural
    (lowercase + s, as most CRDs name it) and no way to pause."""
    group, _, version = api_version.rpartition("/")
    known = KINDS.get(kind)
    if known is not None and known.group == group:
        return known if known.version == version else Kind(group, version, kind, known.plural, known.pause)
    return Kind(group, version, kind, kind.lower() + "s")


def job_id(namespace: str, kind: str, name: str) -> str:
    """A Kubernetes job's id (DESIGN §3.1): `<namespace>/<Kind>/<name>` of the pods' top owner."""
    return f"{namespace}/{kind}/{name}"


def split_job_id(job: str) -> tuple[str, str, str] | None:
    """(namespace, Kind, name) of a job id; None when it is not one (a Slurm id, `namespace/pod`)."""
    parts = job.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]
