"""Container and pod from /proc/<pid>/cgroup lines as each runtime and cgroup version writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cgroups import CgroupInfo, parse_cgroup, read_cgroup

CID = "8d5e3fb0c2a94e1b9c0f6d7a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c"
POD = "3c4f1a2b-1234-4cde-8f00-123456789abc"
POD_ = POD.replace("-", "_")

CASES = {
    "docker, cgroup v1": (
        f"12:pids:/docker/{CID}\n11:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
        CgroupInfo(CID, None)),
    "docker with systemd driver, cgroup v2": (f"0::/system.slice/docker-{CID}.scope\n", CgroupInfo(CID, None)),
    "docker with cgroupfs driver, cgroup v2": (f"0::/docker/{CID}\n", CgroupInfo(CID, None)),
    "kubernetes cgroupfs, docker/containerd, v1, burstable": (
        f"11:cpu,cpuacct:/kubepods/burstable/pod{POD}/{CID}\n10:memory:/kubepods/burstable/pod{POD}/{CID}\n",
        CgroupInfo(CID, POD)),
    "kubernetes cgroupfs, v1, guaranteed": (f"4:devices:/kubepods/pod{POD}/{CID}\n", CgroupInfo(CID, POD)),
    "kubernetes systemd, docker, v1": (
        f"10:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/docker-{CID}.scope\n",
        CgroupInfo(CID, POD)),
    "kubernetes systemd, containerd, v2": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_}.slice/cri-containerd-{CID}.scope\n",
        CgroupInfo(CID, POD)),
    "kubernetes systemd, guaranteed, containerd, v2": (
        f"0::/kubepods.slice/kubepods-pod{POD_}.slice/cri-containerd-{CID}.scope\n", CgroupInfo(CID, POD)),
    "kubernetes systemd, cri-o, v2": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/crio-{CID}.scope\n",
        CgroupInfo(CID, POD)),
    "kubernetes cgroupfs, cri-o, v1": (
        f"9:memory:/kubepods/besteffort/pod{POD}/crio-{CID}\n", CgroupInfo(CID, POD)),
    "cri-o conmon is not the container": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_}.slice/crio-conmon-{CID}.scope\n",
        CgroupInfo(None, POD)),
    "kind: kubelet.slice nesting, v2": (
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{POD_}.slice/cri-containerd-{CID}.scope\n", CgroupInfo(CID, POD)),
    "v1 and v2 hybrid: the v2 line first": (
        f"12:memory:/user.slice\n0::/system.slice/docker-{CID}.scope\n", CgroupInfo(CID, None)),
    "podman rootless, v2": (
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
        CgroupInfo(CID, None)),
    "host process in a login session": ("0::/user.slice/user-1000.slice/session-3.scope\n", CgroupInfo()),
    "slurm step, v2": ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
                       CgroupInfo(service="slurmstepd.scope", job="4242")),
    "slurm step, v1": ("4:memory:/slurm/uid_1000/job_4242/step_0/task_0\n", CgroupInfo(service="slurm", job="4242")),
    "slurm step, v1 per node": ("4:memory:/slurm_gpu07/uid_0/job_17/step_batch/task_0\n",
                                CgroupInfo(service="slurm", job="17")),
    "a systemd service": ("0::/system.slice/nvidia-dcgm.service\n", CgroupInfo(service="nvidia-dcgm.service")),
    "a service in a nested slice": ("0::/system.slice/ml.slice/inference@3.service\n",
                                    CgroupInfo(service="inference@3.service")),
    "slurm step, cgroup v1, two lines": (
        "12:memory:/slurm/uid_1000/job_77/step_batch/task_0\n4:devices:/slurm/uid_1000/job_77/step_batch\n",
        CgroupInfo(service="slurm", job="77")),
    "slurm on a node with its own slice name": (
        "0::/system.slice/slurmstepd_node7.scope/job_12/step_0\n",
        CgroupInfo(service="slurmstepd_node7.scope", job="12")),
    "a directory named like a job outside slurm": ("0::/user.slice/job_5/x\n", CgroupInfo()),
    "empty": ("", CgroupInfo()),
}


@pytest.mark.parametrize("text,expected", list(CASES.values()), ids=list(CASES))
def test_parse_cgroup(text: str, expected: CgroupInfo) -> None:
    assert parse_cgroup(text) == expected


def test_read_cgroup_from_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(CASES["kubernetes systemd, containerd, v2"][0])
    assert read_cgroup(42, tmp_path) == CgroupInfo(CID, POD)
    assert read_cgroup(43, tmp_path) == CgroupInfo()
