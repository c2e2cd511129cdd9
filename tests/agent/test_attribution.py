"""Process attribution: psutil identity, owner resolution, pods from a kubelet answering over HTTP."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web

from agent.attribution import Attributor, PsutilIdentifier, resolve_owner, truncate
from agent.kubelet import PodDirectory, PodMeta
from agent.sample import ProcessIdentity
from gpuevents.config import AttributionConfig
from gpuevents.config.kube import KubeletConfig

POD_UID = "3c4f1a2b-1234-4cde-8f00-123456789abc"
POD = PodMeta(uid=POD_UID, namespace="ml", name="train-7", labels={"owner": "pod-owner@x.org"},
              annotations={"gpuevents/owner": "@ann"})


def test_owner_from_config_first() -> None:
    a = AttributionConfig(default_domain="example.com", owner_pod_label="owner")
    assert resolve_owner("alice", POD, {"alice": "@alice-slack"}, a) == "@alice-slack"


def test_owner_from_pod_label_then_annotation() -> None:
    assert resolve_owner("alice", POD, {}, AttributionConfig(owner_pod_label="owner")) == "pod-owner@x.org"
    a = AttributionConfig(owner_pod_label="missing", owner_pod_annotation="gpuevents/owner")
    assert resolve_owner("alice", POD, {}, a) == "@ann"


def test_owner_from_default_domain_last_else_none() -> None:
    assert resolve_owner("alice", None, {}, AttributionConfig(default_domain="example.com")) == "alice@example.com"
    assert resolve_owner("alice", None, {}, AttributionConfig()) is None
    assert resolve_owner(None, None, {}, AttributionConfig(default_domain="example.com")) is None


def test_identify_a_real_process() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "x" * 300])
    try:
        # Right after fork the child has no command line yet: wait (with a deadline) until it has exec'd.
        deadline = time.monotonic() + 10
        while not psutil.Process(p.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        ident = PsutilIdentifier(cmdline_max=64).identify([p.pid])[p.pid]
        assert ident.user == getpass.getuser() and ident.uid == os.getuid()
        assert ident.ppid == os.getpid() and ident.name.startswith("python")
        assert len(ident.cmdline) == 64 and ident.cmdline.endswith("…")
        assert abs(ident.create_time.timestamp() - psutil.Process(p.pid).create_time()) < 0.01
    finally:
        p.kill()
        p.wait()


def test_identify_caches_per_process_and_forgets_ended_ones() -> None:
    ident = PsutilIdentifier()
    me = os.getpid()
    first = ident.identify([me])[me]
    assert ident.identify([me])[me] is first  # cached: psutil not read again
    assert ident.identify([]) == {} and ident._cache == {}
    assert ident.identify([2**22 + 12345]) == {}  # no such pid


def test_truncate() -> None:
    assert truncate("abc", 5) == "abc" and truncate("abcdef", 4) == "abc…"


def test_attributor_adds_pod_and_owner() -> None:
    att = Attributor(AttributionConfig(owner_pod_label="owner"), {}, {POD_UID: POD}.get)
    raw = ProcessIdentity(pid=5, create_time=datetime(2026, 1, 1, tzinfo=UTC), user="alice", pod_uid=POD_UID)
    done = att.complete({5: raw})[5]
    assert (done.pod, done.labels, done.owner) == ("ml/train-7", {"owner": "pod-owner@x.org"}, "pod-owner@x.org")


def test_team_pod_label_becomes_the_team_label() -> None:
    pod = PodMeta(uid=POD_UID, namespace="ml", name="t", labels={"acme.com/team": "nlp"})
    att = Attributor(AttributionConfig(team_pod_label="acme.com/team"), {}, {POD_UID: pod}.get)
    raw = ProcessIdentity(pid=5, create_time=datetime(2026, 1, 1, tzinfo=UTC), user="alice", pod_uid=POD_UID)
    assert att.complete({5: raw})[5].labels == {"acme.com/team": "nlp", "team": "nlp"}


def test_attributor_fills_the_pod_once_the_kubelet_knows_it() -> None:
    pods: dict[str, PodMeta] = {}
    att = Attributor(AttributionConfig(default_domain="x.org"), {}, pods.get)
    raw = ProcessIdentity(pid=5, create_time=datetime(2026, 1, 1, tzinfo=UTC), user="alice", pod_uid=POD_UID)
    assert att.complete({5: raw})[5].pod is None
    pods[POD_UID] = POD
    assert att.complete({5: raw})[5].pod == "ml/train-7"


# ---------------------------------------------------------------- kubelet
POD_LIST = {
    "kind": "PodList", "apiVersion": "v1",
    "items": [{"metadata": {"name": "train-7", "namespace": "ml", "uid": POD_UID,
                            "labels": {"owner": "pod-owner@x.org"},
                            "annotations": {"gpuevents/owner": "@ann"}},
               "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}},
              {"metadata": {"name": "serve-1", "namespace": "infer", "uid": "9" * 8 + "-0000-4000-8000-" + "0" * 12},
               "spec": {"nodeName": "n1"},
               "status": {"phase": "Running",
                          "initContainerStatuses": [{"name": "fetch-weights",
                                                     "containerID": "containerd://" + "a" * 64}],
                          "containerStatuses": [{"name": "triton", "containerID": "containerd://" + "b" * 64},
                                                {"name": "sidecar"}]}}],
}


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[tuple[str, list[str]]]:
    auth: list[str] = []

    async def pods(request: web.Request) -> web.Response:
        auth.append(request.headers.get("Authorization", ""))
        return web.json_response(POD_LIST)

    app = web.Application()
    app.router.add_get("/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # aiohttp internals: the bound port
    try:
        yield f"http://127.0.0.1:{port}", auth
    finally:
        await runner.cleanup()


async def test_pods_from_the_kubelet(kubelet: tuple[str, list[str]], tmp_path: Path) -> None:
    url, auth = kubelet
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    pods = PodDirectory(KubeletConfig(url=url, token_file=token))
    async with aiohttp.ClientSession() as session:
        assert await pods.refresh(session) == 2
    assert pods.get(POD_UID) == POD
    assert auth == ["Bearer s3cret"]
    serve = pods.get("9" * 8 + "-0000-4000-8000-" + "0" * 12)
    assert serve is not None and serve.containers == {"a" * 64: "fetch-weights", "b" * 64: "triton"}


def test_the_container_s_name_comes_from_its_pod() -> None:
    pod = PodMeta(uid=POD_UID, namespace="ml", name="t", containers={"c" * 64: "trainer"})
    att = Attributor(AttributionConfig(), {}, {POD_UID: pod}.get)
    raw = ProcessIdentity(pid=5, create_time=datetime(2026, 1, 1, tzinfo=UTC), user="alice", pod_uid=POD_UID,
                          container_id="c" * 64)
    other = ProcessIdentity(pid=6, create_time=datetime(2026, 1, 1, tzinfo=UTC), pod_uid=POD_UID,
                            container_id="d" * 64)
    done = att.complete({5: raw, 6: other})
    assert (done[5].container, done[6].container) == ("trainer", None)


def test_a_process_in_a_slurm_job_is_found_from_its_cgroup(tmp_path: Path) -> None:
    me = os.getpid()
    (tmp_path / str(me)).mkdir()
    (tmp_path / str(me) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_31337/step_0/user/task_0\n")
    assert PsutilIdentifier(proc_root=tmp_path).identify([me])[me].job == "31337"


async def test_kubelet_failure_keeps_the_known_pods(tmp_path: Path) -> None:
    pods = PodDirectory(KubeletConfig(url="http://127.0.0.1:9", token_file=None))
    pods.pods = {POD_UID: POD}
    async with aiohttp.ClientSession() as session:
        assert await pods.refresh(session, timeout=2) == 1
    assert pods.errors == 1 and pods.get(POD_UID) == POD
