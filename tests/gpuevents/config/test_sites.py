"""`nats.jetstream_domain` and `nats.sites`: a domain is one subject token, a site is listed once and every
site's domain is its own; each mistake is one line at its place in the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuevents.config import load_config
from gpuevents.yamlpos import LocatedError


def _problems(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(LocatedError) as e:
        load_config(f)
    return [str(p) for p in e.value.problems]


def test_sites_load_with_their_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nats:\n  jetstream_domain: hub\n  sites:\n    - {cluster: site-a, jetstream_domain: dc-1}\n"
                 "    - {cluster: lab, max_bytes: 2GiB}\n")
    cfg = load_config(f)
    assert cfg.nats.jetstream_domain == "hub"
    a, lab = cfg.nats.sites
    assert (a.cluster, a.jetstream_domain, a.max_age, int(a.max_bytes)) == ("site-a", "dc-1", 7 * 86400, 1 << 30)
    assert (lab.jetstream_domain, int(lab.max_bytes)) == (None, 2 << 30)
    assert cfg.nats.site("lab") is lab and cfg.nats.site("nowhere") is None


def test_a_domain_that_is_not_one_token_is_refused_where_it_is(tmp_path: Path) -> None:
    [p] = _problems(tmp_path, "nats:\n  jetstream_domain: dc.1\n")
    assert ":2: nats.jetstream_domain:" in p and "letters, digits, '-' and '_' only" in p


def test_a_site_listed_twice_or_two_sites_of_one_domain_are_refused(tmp_path: Path) -> None:
    [twice] = _problems(tmp_path, "nats:\n  sites:\n    - {cluster: a}\n    - {cluster: a}\n")
    assert "nats.sites" in twice and "cluster 'a' is listed twice" in twice
    [shared] = _problems(tmp_path, "nats:\n  sites:\n    - {cluster: a, jetstream_domain: d}\n"
                                   "    - {cluster: b, jetstream_domain: d}\n")
    assert "two sites share a jetstream_domain" in shared
