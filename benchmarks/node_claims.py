"""What finding two agents on one node costs the engine per event, against decoding the same event.

    python benchmarks/node_claims.py [--json] [--nodes 2000] [--rounds 10]

Decodes `nodes × rounds` node.snapshot events (8 GPUs, one agent id a node; every tenth node has two agents
taking turns) with the engine's decoder (the baseline: work the engine does for every event anyway), then passes
the decoded events through `NodeClaims.see`. Prints both rates and the share the check adds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, encode_event, make_event
from rules.engine.claims import NodeClaims
from rules.intake.decoder import RepeatDecoder

T0 = datetime(2026, 12, 3, tzinfo=UTC)


def events(nodes: int, rounds: int) -> list[bytes]:
    out = []
    for r in range(rounds):
        for n in range(nodes):
            name = f"node-{n:05d}"
            agent = f"agent-{n}-{r % 2 if n % 10 == 0 else 0}"
            gpus = [GpuInfo(node=name, index=i, util_pct=50.0, idle=False) for i in range(8)]
            snap = NodeSnapshot(node=NodeInfo(name=name, cluster="c", gpu_count=8, agent_id=agent), gpus=gpus)
            out.append(encode_event(make_event("node.snapshot", name, snap, cluster="c",
                                               time=T0 + timedelta(seconds=15 * r))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    raw = events(a.nodes, a.rounds)
    t0 = time.perf_counter()
    decoder = RepeatDecoder()
    decoded = []
    for r in raw:  # as the engine's acceptor: each event accepted (its subject checked) before the next
        e = decoder.decode(r)
        decoder.accepted(e)
        decoded.append(e)
    t1 = time.perf_counter()
    claims = NodeClaims()
    found = sum(1 for e in decoded if claims.see(e, e.time) is not None)
    t2 = time.perf_counter()
    figures = {"events": len(raw), "decode_per_s": round(len(raw) / (t1 - t0)),
               "claims_per_s": round(len(raw) / (t2 - t1)),
               "claims_vs_decode_pct": round(100 * (t2 - t1) / (t1 - t0), 2),
               "conflicts_found": found, "nodes_with_two_agents": len(range(0, a.nodes, 10))}
    if a.json:
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
