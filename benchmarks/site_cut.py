"""A site's link cut and restored: does what its agent reported meanwhile reach the hub, and how soon.

    python benchmarks/site_cut.py [--cut 20] [--json]

1. Starts a hub nats-server and two leaf servers with JetStream domains (site-a's link through a relay that can
   be cut), the fixture the sites tests use.
2. Runs `gpuevents engine` at the hub (nats.sites lists both sites) and `gpuevents agent --simulate` at site-a
   (a snapshot a second), each a process of its own.
3. Once site-a's snapshots reach the hub, cuts its link for `--cut` seconds, restores it, and reports the
   snapshots the agent took during the cut (as site-a's store holds them), how many were at the hub before the
   link came back (0 expected), how long after it they all were, and how many the hub holds twice (0 expected).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuevents import subjects as S
from tests.gpuevents.cli.test_sites_processes import _snapshot_times, _start, _stop
from tests.nats_sites import start_sites
from tests.waiting import wait_for


async def run(cut_s: float) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="site-cut"))
    sites = await start_sites(tmp / "sites")
    rules = tmp / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text("rules:\n  - name: r\n    entity: gpu\n    when: gpu.idle\n    for: 1h\n"
                                  "    actions: [{type: log, message: idle}]\n")
    hub = tmp / "hub.yaml"
    hub.write_text(f"cluster: hub\nnats: {{url: '{sites.hub.url}', sites: [{{cluster: site-a, jetstream_domain: "
                   "site-a}, {cluster: site-b, jetstream_domain: site-b}]}\n"
                   f"engine: {{rules: ['{rules}'], usage_db: '{tmp / 'usage.sqlite'}'}}\n")
    site = tmp / "site-a.yaml"
    site.write_text(f"cluster: site-a\nnats: {{url: '{sites.leaves['site-a'].url}'}}\n"
                    "agent: {node_name: gpu-0, snapshot_interval: 1s}\n")
    engine = _start(["engine"], hub, tmp, tmp / "engine.log")
    agent = _start(["agent", "--simulate"], site, tmp, tmp / "agent.log")
    try:
        await wait_for(lambda: _snapshot_times(sites.hub.url, S.STREAM_EVENTS), 120, 0.5, what="a first snapshot")
        sites.relay.cut()
        cut = datetime.now().astimezone()
        await asyncio.sleep(cut_s)  # the outage itself
        during = [t for t in await _snapshot_times(sites.leaves["site-a"].url, S.STREAM_SITE) if t > cut]
        early = [t for t in await _snapshot_times(sites.hub.url, S.STREAM_EVENTS) if t > cut]
        sites.relay.restore()
        back = time.monotonic()
        async def all_at_hub() -> bool:
            return set(during) <= set(await _snapshot_times(sites.hub.url, S.STREAM_EVENTS))

        await wait_for(all_at_hub, 600, 0.1, what="the snapshots of the cut at the hub")
        caught_up = time.monotonic() - back
        at_hub = await _snapshot_times(sites.hub.url, S.STREAM_EVENTS)
        return {"cut_s": cut_s, "snapshots_during_cut": len(during), "at_hub_before_restore": len(early),
                "all_at_hub_after_s": round(caught_up, 2), "twice_at_hub": len(at_hub) - len(set(at_hub))}
    finally:
        _stop(agent)
        _stop(engine)
        sites.stop()
        await sites.relay.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cut", type=float, default=20.0, help="seconds site-a's link stays cut")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(run(args.cut))
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
