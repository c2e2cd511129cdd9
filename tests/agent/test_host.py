"""What the agent knows of its host: the host's user database (also from a container) and the pid namespace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from agent.attribution import Attributor, PsutilIdentifier
from agent.host import UserDb, in_host_pid_namespace, parse_passwd
from agent.kill import KillPolicy
from agent.sample import LiveProcess
from gpuevents.config import AttributionConfig, ProtectConfig
from tests.waiting import wait_for

HOST_PASSWD = "root:x:0:0:root:/root:/bin/bash\n# a comment\nhostalice:x:{uid}:100::/home/a:/bin/sh\nbad:x:nan:1\n"


def test_parse_passwd_names_uids_and_skips_bad_lines() -> None:
    assert parse_passwd(HOST_PASSWD.format(uid=1000)) == {0: "root", 1000: "hostalice"}


def test_users_are_named_from_the_hosts_file_not_the_agents_own(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(f"hostalice:x:{os.getuid()}:100::/home/a:/bin/sh\n")  # the host's name for our uid
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        db = UserDb(passwd)
        ident = PsutilIdentifier(users=db).identify([p.pid])[p.pid]
        assert ident.user == "hostalice" and ident.uid == os.getuid()
        passwd.write_text("someone:x:54321:0::/:/bin/sh\n")  # the host's file changes: read again
        os.utime(passwd, (time.time() + 5, time.time() + 5))
        assert db.name(os.getuid()) is None
    finally:
        p.kill()
        p.wait()


def test_a_uid_the_host_cannot_name_stays_unnamed_and_the_owner_is_unknown(tmp_path: Path) -> None:
    db = UserDb(tmp_path / "missing")
    assert db.name(4242) is None and db.name(None) is None
    attr = Attributor(AttributionConfig(default_domain="example.com"), {})
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ident = PsutilIdentifier(users=db).identify([p.pid])[p.pid]
        assert ident.user is None
        assert attr.complete({p.pid: ident})[p.pid].owner is None  # never `1000@example.com`
    finally:
        p.kill()
        p.wait()


def test_the_agent_refuses_to_kill_a_process_whose_user_it_cannot_name() -> None:
    from datetime import UTC, datetime

    policy = KillPolicy(ProtectConfig(users=["root"]), agent_pid=1, node_labels={})
    live = LiveProcess(pid=77, create_time=datetime.now(UTC), user=None, name="python")
    assert "cannot be named" in (policy.refusal(77, live) or "")
    named = LiveProcess(pid=77, create_time=datetime.now(UTC), user="alice", name="python")
    assert policy.refusal(77, named) is None


def test_outside_the_hosts_pid_namespace_every_kill_is_refused() -> None:
    assert in_host_pid_namespace("Name:\tx\nNSpid:\t4242\n") is True
    assert in_host_pid_namespace("Name:\tx\nNSpid:\t4242\t7\n") is False  # a container without hostPID
    from datetime import UTC, datetime

    policy = KillPolicy(ProtectConfig(users=[]), agent_pid=1, node_labels={}, host_pids=False)
    live = LiveProcess(pid=77, create_time=datetime.now(UTC), user="alice", name="python")
    assert "pid namespace" in (policy.refusal(77, live) or "")


async def test_ppid_is_read_live_so_an_orphan_is_seen() -> None:
    # A parent that starts a long-lived child, prints its pid, then waits to be killed.
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], stdout=subprocess.DEVNULL)\n"
        "print(c.pid, flush=True)\ntime.sleep(60)\n", stdout=asyncio.subprocess.PIPE)
    assert parent.stdout is not None
    child = int(await parent.stdout.readline())
    identifier = PsutilIdentifier(users=UserDb(None))
    attr = Attributor(AttributionConfig(), {})
    try:
        first = attr.complete(identifier.identify([child]))[child]
        assert first.ppid == parent.pid
        parent.kill()
        await parent.wait()
        await wait_for(lambda: attr.complete(identifier.identify([child]))[child].ppid != parent.pid,
                        timeout=10, what="the orphan's new parent")
        orphan = attr.complete(identifier.identify([child]))[child]
        assert orphan.ppid == psutil.Process(child).ppid() != parent.pid
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
