"""Several sites with real `gpuevents` processes: `gpuevents engine` on a hub with two leaf sites (JetStream
domains), `gpuevents agent --simulate` at site-a; site-a's link is cut while its agent goes on reporting, and
`gpuevents status` shows the site cut off; once the link is back, every snapshot the agent took during the cut is
in the hub's stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import NatsConfig
from tests.gpuevents.cli.test_stopping import _env
from tests.nats_sites import Sites, start_sites, wait_linked
from tests.waiting import wait_for

GPUEVENTS = [sys.executable, "-m", "gpuevents.cli"]
SNAPSHOTS_IN_CUT = 5  # the agent's snapshots (one a second) taken while its link is cut


@pytest.fixture
async def sites(tmp_path: Path) -> AsyncIterator[Sites]:
    s = await start_sites(tmp_path / "sites")
    try:
        yield s
    finally:
        s.stop()
        await s.relay.stop()


def _start(argv: list[str], cfg: Path, tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([*GPUEVENTS, *argv, "-c", str(cfg)], env=_env(tmp_path), cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(p: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


async def _snapshot_times(url: str, stream: str, domain: str | None = None) -> list[datetime]:
    async with Bus(NatsConfig(url=url, jetstream_domain=domain)) as bus:
        subject = S.event_subject("site-a", "gpu-0", "node.snapshot")
        return [datetime.fromisoformat(json.loads(m.data)["time"]) async for m in bus.replay(stream, subject)]


async def test_what_a_cut_off_sites_agent_reported_reaches_the_hub(sites: Sites, tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text("rules:\n  - name: r\n    entity: gpu\n    when: gpu.idle\n    for: 1h\n"
                                  "    actions: [{type: log, message: idle}]\n")
    hub_cfg = tmp_path / "hub.yaml"
    hub_cfg.write_text(
        f"cluster: hub\nnats: {{url: '{sites.hub.url}', sites: [{{cluster: site-a, jetstream_domain: site-a}}, "
        "{cluster: site-b, jetstream_domain: site-b}]}\n"
        f"engine: {{rules: ['{rules}'], usage_db: '{tmp_path / 'usage.sqlite'}', tick: 1s}}\n")
    site_cfg = tmp_path / "site-a.yaml"
    site_cfg.write_text(f"cluster: site-a\nnats: {{url: '{sites.leaves['site-a'].url}', reconnect_wait: 0.5s}}\n"
                        "agent: {node_name: gpu-0, sample_interval: 0.5s, snapshot_interval: 1s}\n")
    engine = _start(["engine"], hub_cfg, tmp_path, tmp_path / "engine.log")
    agent = _start(["agent", "--simulate"], site_cfg, tmp_path, tmp_path / "agent.log")
    try:
        await wait_for(lambda: _snapshot_times(sites.hub.url, S.STREAM_EVENTS), 60, 0.5,
                       what=f"site-a's snapshots at the hub; engine log:\n{(tmp_path / 'engine.log').read_text()}")
        sites.relay.cut()
        cut_at = datetime.now().astimezone()

        async def status_says_cut() -> str | None:
            done = await asyncio.to_thread(subprocess.run, [*GPUEVENTS, "status", "-c", str(hub_cfg)],
                                           env=_env(tmp_path), capture_output=True, text=True, timeout=60)
            text = " ".join(done.stdout.split())
            return text if "SITE site-a CUT OFF from the hub" in text else None

        await wait_for(status_says_cut, 60, 0.5, what="gpuevents status to show site-a cut off")

        async def taken_in_cut() -> list[datetime] | None:
            times = [t for t in await _snapshot_times(sites.leaves["site-a"].url, S.STREAM_SITE) if t > cut_at]
            return times if len(times) >= SNAPSHOTS_IN_CUT else None

        during = await wait_for(taken_in_cut, 60, 0.5, what="the agent's snapshots stored at its site")
        at_hub = await _snapshot_times(sites.hub.url, S.STREAM_EVENTS)
        assert not set(during) & set(at_hub)  # the link is down: none reached the hub yet
        sites.relay.restore()
        await wait_linked(sites, 60)

        async def all_at_hub() -> bool:
            return set(during) <= set(await _snapshot_times(sites.hub.url, S.STREAM_EVENTS))

        await wait_for(all_at_hub, 60, 0.5, what="the snapshots taken during the cut at the hub")
        times = await _snapshot_times(sites.hub.url, S.STREAM_EVENTS)
        assert len(times) == len(set(times))  # each once
    finally:
        _stop(agent)
        _stop(engine)
    assert "Traceback" not in (tmp_path / "engine.log").read_text()
