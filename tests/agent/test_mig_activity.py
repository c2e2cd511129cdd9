"""MIG instances without GPM (A100, A30): free when nothing holds them, unknown when held with no signal, and
decided by a dcgm-exporter on the node where there is one (served here over real HTTP, in its text format)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent.core import NodeCore
from agent.dcgmscrape import DcgmActivity, parse
from agent.sample import GpuReading, NodeReading, ProcessIdentity, ProcReading
from gpuevents.config import ThresholdsConfig
from gpuevents.config.gpu import AgentDcgmConfig
from gpuevents.events import SnapshotEvent

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
PAGE = (Path(__file__).with_name("data") / "dcgm-exporter" / "a100-mig-metrics.txt").read_text()
A100 = "NVIDIA A100-SXM4-40GB"


def readings(util: float | None = None) -> tuple[GpuReading, ...]:
    """GPU 0 whole, GPU 1 in MIG mode with instances 2 (GI 1, 3g.20gb) and 3 (GI 9, 1g.5gb): no GPM."""
    return (
        GpuReading(index=0, uuid="GPU-a100-0", model=A100, util_pct=91.0, mem_used_mib=1.0, mem_total_mib=40960.0),
        GpuReading(index=1, uuid="GPU-a100-1", model=A100, util_pct=None),
        GpuReading(index=2, uuid="MIG-1", model=f"{A100} MIG 3g.20gb", util_pct=util, mig_parent="GPU-a100-1",
                   mig_gi_id=1, mig_profile="3g.20gb", mem_used_mib=4213.0, mem_total_mib=20096.0),
        GpuReading(index=3, uuid="MIG-9", model=f"{A100} MIG 1g.5gb", util_pct=util, mig_parent="GPU-a100-1",
                   mig_gi_id=9, mig_profile="1g.5gb", mem_used_mib=1571.0, mem_total_mib=4864.0),
    )


def ident(pid: int, user: str) -> ProcessIdentity:
    return ProcessIdentity(pid=pid, create_time=T0 - timedelta(hours=1), name="python", user=user)


def core() -> NodeCore:
    return NodeCore(node="n1", cluster="c", thresholds=ThresholdsConfig(), snapshot_interval_s=15)


def snapshot(c: NodeCore, at: datetime, reading: NodeReading, idents: dict[int, ProcessIdentity]) -> SnapshotEvent:
    c.last_snapshot_at = None
    events = [e for e in c.step(at, reading, idents) if isinstance(e, SnapshotEvent)]
    return events[0]


def test_a_free_instance_is_idle_and_a_held_one_is_unknown_never_busy() -> None:
    c = core()
    procs = (ProcReading(pid=10, gpu=2, mem_mib=4000.0),)
    snap = snapshot(c, T0, NodeReading(gpus=readings(), procs=procs), {10: ident(10, "alice")}).data
    held, free = snap.gpus[2], snap.gpus[3]
    assert (held.idle, held.activity_known, held.owner) == (False, False, "alice")
    assert (free.idle, free.activity_known, free.idle_since) == (True, True, T0)
    assert snap.node.gpus_busy == 1  # GPU 0 only: neither the parent nor the unknown instance
    # a process arrives on the free instance: no longer idle, and unknown, not busy
    procs2 = (*procs, ProcReading(pid=11, gpu=3, mem_mib=1500.0))
    later = snapshot(c, T0 + timedelta(minutes=5), NodeReading(gpus=readings(), procs=procs2),
                     {10: ident(10, "alice"), 11: ident(11, "bob")}).data
    assert [(g.idle, g.activity_known, g.idle_since) for g in later.gpus[2:]] == [(False, False, None)] * 2
    # both leave: free again, idle from then on
    gone = snapshot(c, T0 + timedelta(minutes=10), NodeReading(gpus=readings()), {}).data
    assert [(g.idle, g.activity_known) for g in gone.gpus[2:]] == [(True, True)] * 2
    assert gone.gpus[2].idle_since == T0 + timedelta(minutes=10)


def test_the_page_parses_by_parent_uuid_and_index_and_skips_whole_gpus() -> None:
    values = parse(PAGE)
    assert values[("GPU-a100-1", 9)] == {"gr_engine_active_pct": 87.451, "sm_active_pct": 80.12}
    assert values[("#1", 1)] == {"gr_engine_active_pct": 0.0}
    assert not any(k[0] in ("GPU-a100-0", "#0") for k in values)


class _Exporter:
    """A local HTTP server serving a dcgm-exporter page; `page = None` answers 503."""

    def __init__(self) -> None:
        self.page: str | None = PAGE
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                if owner.page is None:
                    self.send_error(503)
                    return
                body = owner.page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter() -> Iterator[_Exporter]:
    e = _Exporter()
    yield e
    e.close()


def test_dcgm_exporter_decides_an_instance_idle_or_busy(exporter: _Exporter) -> None:
    dcgm = DcgmActivity(AgentDcgmConfig(url=exporter.url, interval=15, max_age=60))
    c = core()
    procs = (ProcReading(pid=10, gpu=2, mem_mib=4000.0), ProcReading(pid=11, gpu=3, mem_mib=1500.0))
    idents = {10: ident(10, "alice"), 11: ident(11, "bob")}
    reading = dcgm.fill(NodeReading(gpus=readings(), procs=procs), T0)
    snap = snapshot(c, T0, reading, idents).data
    assert (snap.gpus[2].idle, snap.gpus[2].activity_known, snap.gpus[2].util_pct) == (True, True, 0.0)
    assert (snap.gpus[3].idle, snap.gpus[3].activity_known, snap.gpus[3].util_pct) == (False, True, 87.451)
    assert snap.gpus[3].sm_active_pct == 80.12
    assert snap.node.gpus_busy == 2 and snap.node.gpus_idle == 1
    # read again only after its interval
    dcgm.fill(NodeReading(gpus=readings(), procs=procs), T0 + timedelta(seconds=5))
    assert exporter.hits == 1
    # the exporter stops answering: its last values hold until max_age, then the instances are unknown again
    exporter.page = None
    kept = dcgm.fill(NodeReading(gpus=readings(), procs=procs), T0 + timedelta(seconds=30))
    assert exporter.hits == 2 and kept.gpus[3].util_pct == 87.451
    stale = dcgm.fill(NodeReading(gpus=readings(), procs=procs), T0 + timedelta(seconds=75))
    assert [g.util_pct for g in stale.gpus[2:]] == [None, None]
    after = snapshot(c, T0 + timedelta(seconds=75), stale, idents).data
    assert [(g.idle, g.activity_known) for g in after.gpus[2:]] == [(False, False)] * 2


def test_an_instance_with_its_own_signal_is_left_alone(exporter: _Exporter) -> None:
    dcgm = DcgmActivity(AgentDcgmConfig(url=exporter.url))
    filled = dcgm.fill(NodeReading(gpus=readings(util=42.0)), T0)
    assert [g.util_pct for g in filled.gpus[2:]] == [42.0, 42.0]
    assert exporter.hits == 0  # nothing lacked a signal: not even read


def test_not_the_text_format_is_no_signal(exporter: _Exporter) -> None:
    exporter.page = "<html>login</html>\n{"
    dcgm = DcgmActivity(AgentDcgmConfig(url=exporter.url))
    filled = dcgm.fill(NodeReading(gpus=readings()), T0)
    assert [g.util_pct for g in filled.gpus[2:]] == [None, None] and dcgm.failing


def test_the_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        AgentDcgmConfig(url="127.0.0.1:9400/metrics")
