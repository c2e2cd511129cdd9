"""Configuration of several sites on one hub (DESIGN §9 "Several sites"): the JetStream domain a process's
streams live in (`nats.jetstream_domain`), and the sites whose leaf servers keep a store of their own
(`nats.sites`), which the engine sources into the hub's streams."""

from __future__ import annotations

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator

from gpuevents.durations import Duration

# A name NATS takes as a JetStream domain: it becomes one token of `$JS.<domain>.API`.
_DOMAIN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


def check_domain(value: str | None) -> str | None:
    if value is not None and (not value or not set(value) <= _DOMAIN_CHARS):
        raise ValueError(f"JetStream domain {value!r}: letters, digits, '-' and '_' only (it is a subject token)")
    return value


class SiteConfig(BaseModel):
    """One site: its `cluster` (as its agents' config says) and its leaf server's JetStream domain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str = Field(min_length=1, description="the site's `cluster`, as its agents publish it")
    jetstream_domain: str | None = Field(
        None, description="the domain of the site's leaf JetStream; unset: the site's leaf has no JetStream and "
        "its events go straight to the hub's stream (lost while the link is down, beyond the agents' buffers)")
    max_age: Duration = Field(7 * 86400, gt=0, description="how long the site's store keeps an event")
    max_bytes: ByteSize = Field(ByteSize(1 << 30), ge=1 << 20,
                                description="the site's store; past it, its oldest events go")

    @field_validator("jetstream_domain")
    @classmethod
    def _domain(cls, v: str | None) -> str | None:
        return check_domain(v)


def check_sites(sites: list[SiteConfig]) -> list[SiteConfig]:
    seen: set[str] = set()
    for site in sites:
        if site.cluster in seen:
            raise ValueError(f"nats.sites: cluster {site.cluster!r} is listed twice")
        seen.add(site.cluster)
    domains = [s.jetstream_domain for s in sites if s.jetstream_domain]
    if len(set(domains)) != len(domains):
        raise ValueError("nats.sites: two sites share a jetstream_domain; every leaf's domain is its own")
    return sites


class SitesSection(BaseModel):
    """The keys of `nats` about sites (a part of NatsConfig)."""

    jetstream_domain: str | None = Field(None, description="the JetStream domain of the hub's streams (DESIGN §9); "
                                         "unset: the server's own")
    sites: list[SiteConfig] = Field(default_factory=list, description="the engine's sites on leaf servers: each "
                                    "one's store, in its domain, is sourced into the hub's streams")

    @field_validator("jetstream_domain")
    @classmethod
    def _domain(cls, v: str | None) -> str | None:
        return check_domain(v)

    @field_validator("sites")
    @classmethod
    def _sites(cls, v: list[SiteConfig]) -> list[SiteConfig]:
        return check_sites(v)

    def site(self, cluster: str) -> SiteConfig | None:
        return next((s for s in self.sites if s.cluster == cluster), None)
