"""Configuration (DESIGN §7): one YAML file, validated; `GPUEVENTS_<SECTION>__<KEY>` overrides; secrets never in
YAML."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuevents.config.gpu import AgentDcgmConfig, AgentPowerCapConfig
from gpuevents.config.keep import KeepBudgetConfig
from gpuevents.config.kube import KubeletConfig, KubernetesJobsConfig, PodResourcesConfig
from gpuevents.config.limits import HoldsConfig as HoldsConfig
from gpuevents.config.limits import LimitConfig as LimitConfig
from gpuevents.config.notify import NotifyConfig
from gpuevents.config.protect import ProtectConfig as ProtectConfig
from gpuevents.config.protect import ProtectedProgram as ProtectedProgram
from gpuevents.config.sched import AgentSlurmConfig, DemandConfig
from gpuevents.config.sites import SitesSection
from gpuevents.diagnose import AgentDiagnosticsConfig
from gpuevents.durations import Duration
from gpuevents.idleness import IdleRule, IdleSignal, model_matches
from gpuevents.yamlpos import Located, LocatedError, YamlDoc, parse_scalar, parse_yaml, read_yaml_text

ENV_PREFIX = "GPUEVENTS_"
SECRET_KEYS = frozenset({"token", "password", "secret", "bot_token", "nkey_seed", "jwt"})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- nats
class TlsConfig(_Section):
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None


class EmbeddedServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(4222, ge=0, le=65535, description="0 picks a free port")
    data_dir: Path = Path(".gpuevents/nats")
    binary: Path | None = None


class StreamsConfig(_Section):
    events_max_age: Duration = 7 * 86400
    audit_max_age: Duration = 90 * 86400
    dlq_max_age: Duration = 7 * 86400
    replicas: int = Field(1, ge=1, le=5)
    # all streams together (DESIGN §7.1), split in gpuevents.bus
    max_bytes: ByteSize = Field(ByteSize(3 << 30), ge=4 << 20)
    events_max_msgs_per_subject: int = Field(50_000, ge=1)  # per node and event type


class NatsConfig(SitesSection, _Section):
    url: str | list[str] | None = Field(None, description="unset: `up` starts an embedded server")
    creds_file: Path | None = None
    tls: TlsConfig = TlsConfig()
    embedded: EmbeddedServerConfig = EmbeddedServerConfig()
    streams: StreamsConfig = StreamsConfig()
    kv_bucket: str = "gpuevents-state"
    inbox_prefix: str | None = Field(None, description="reply subjects prefix; default: the role's (_INBOX.<role>)")
    connect_timeout: Duration = 5
    reconnect_wait: Duration = 2
    publish_buffer: int = Field(10_000, ge=0, description="events kept while NATS is unreachable")
    publish_timeout: Duration = 5

    @property
    def servers(self) -> list[str]:
        if self.url is None:
            return []
        return [self.url] if isinstance(self.url, str) else list(self.url)


# ---------------------------------------------------------------- agent
class IdleByModel(_Section):
    """For GPUs whose model matches `model`, the signal that decides idleness and its threshold."""

    model: str = Field(min_length=1, description="glob on the GPU model name, case-insensitive: '*H100*'")
    signal: IdleSignal = "utilization"
    below: float = Field(ge=0, description="idle below this: % for utilization and sm_active, W for power")
    power_below_w: float | None = Field(None, gt=0, description="second signal: idle only while power is "
                                        "also below this many watts")

    @model_validator(mode="after")
    def _consistent(self) -> IdleByModel:
        if self.signal != "power" and self.below > 100:
            raise ValueError(f"below: {self.signal} is a percentage (0 to 100), got {self.below:g}; "
                             "for watts use signal: power")
        if self.signal == "power" and self.power_below_w is not None:
            raise ValueError("power_below_w: power is already the signal here; drop power_below_w, or "
                             "choose signal: utilization or sm_active with power as the second signal")
        return self

    def rule(self) -> IdleRule:
        return IdleRule(self.signal, self.below, self.power_below_w)


class ThresholdsConfig(_Section):
    idle_util_pct: float = Field(5, ge=0, le=100)
    active_samples: int = Field(3, ge=1)
    hot_temp_c: float = 85
    hot_clear_c: float = 80
    memory_full_pct: float = Field(95, ge=0, le=100)
    idle_by_model: list[IdleByModel] = Field(
        default_factory=list, description="per GPU model, the first entry that matches decides; other models "
        "are idle below idle_util_pct")

    def idle_rule(self, model: str | None) -> IdleRule:
        """The idle rule for a GPU of this model: the first matching `idle_by_model` entry, else utilization."""
        for entry in self.idle_by_model:
            if model_matches(entry.model, model):
                return entry.rule()
        return IdleRule("utilization", self.idle_util_pct)


class AttributionConfig(_Section):
    default_domain: str | None = Field(None, description="owner = <user>@<domain> when nothing else says")
    owner_pod_label: str | None = None
    owner_pod_annotation: str | None = None
    team_pod_label: str | None = None
    cmdline_max: int = Field(1024, ge=16)
    kubelet: KubeletConfig = KubeletConfig()
    passwd: Path | None = Field(None, description="the host's passwd file, to name uids; unset: NSS on the host, "
                                "/proc/1/root/etc/passwd or /host/etc/passwd in a container")


class SimulationConfig(_Section):
    scenario: str = "mixed"
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1, le=64)
    seed: int = 1
    speedup: float = Field(1.0, gt=0)


class AgentKillConfig(_Section):
    max_per_minute: int = Field(10, ge=0)


class AgentConfig(_Section):
    node_name: str = Field(default_factory=socket.gethostname)

    @field_validator("node_name", mode="before")
    @classmethod
    def _default_name(cls, v: object) -> object:
        return socket.gethostname() if v is None or v == "" else v
    labels: dict[str, str] = Field(default_factory=dict)
    sampler: Literal["auto", "nvml", "simulated"] = "auto"
    sample_interval: Duration = 1
    snapshot_interval: Duration = 15
    thresholds: ThresholdsConfig = ThresholdsConfig()
    attribution: AttributionConfig = AttributionConfig()
    kill: AgentKillConfig = AgentKillConfig()
    metrics_port: int | None = Field(None, ge=0, le=65535, description="dcgm-compatible /metrics")
    metrics_address: str = Field("0.0.0.0", min_length=1, description="where /metrics listens: every address, so "
                                 "Prometheus can scrape it; 127.0.0.1 keeps it on the node")
    metrics_process_labels: bool = Field(True, description="false: the per-process series carry no pid, user or "
                                         "process name (summed per GPU and pod or job)")
    hpc_job_mapping_dir: Path | None = Field(None, description="dcgm-exporter's HPC job mapping: a file per GPU "
                                             "(`0`, `1`, MIG `2.3`) listing the jobs on it, one per line")
    slurm: AgentSlurmConfig = AgentSlurmConfig()
    dcgm: AgentDcgmConfig = AgentDcgmConfig()
    power_cap: AgentPowerCapConfig = AgentPowerCapConfig()
    diagnostics: AgentDiagnosticsConfig = AgentDiagnosticsConfig()
    simulation: SimulationConfig = SimulationConfig()
    pod_resources: PodResourcesConfig = PodResourcesConfig()
    kubernetes_jobs: KubernetesJobsConfig = KubernetesJobsConfig()
    kubernetes_node: bool | None = Field(None, description="read this node's labels and cordon from the "
                                         "Kubernetes API (connection: actions.kubernetes); unset: in a pod")
    state_dir: Path | None = Field(None, description="where the agent keeps its GPUs' idle clocks across "
                                   "restarts (e.g. /var/lib/gpuevents); unset: a restart resets them")

    @field_validator("sample_interval", "snapshot_interval")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be greater than 0s")
        return v


# ---------------------------------------------------------------- engine
class EngineConfig(_Section):
    rules: list[Path] = Field(default_factory=list, description="rule files or directories")
    tick: Duration = 30
    timezone: str = "UTC"
    dry_run: bool = False
    offline_grace: Duration = 600
    request_ttl: Duration = 300
    max_clock_skew: Duration = 60
    max_clock_offset: Duration = 30  # an engine further than this from the NATS server's clock does not lead
    limits: dict[str, LimitConfig] = Field(default_factory=dict, description="per action type")
    holds: HoldsConfig = HoldsConfig()
    lease_ttl: Duration = 10
    partitions: int = Field(1, ge=1, le=256, description="the fleet split by node among engine replicas")
    consumer: str = "gpuevents-engine"
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_address: str = Field("0.0.0.0", min_length=1, description="where /metrics listens (every address, "
                                 "so Prometheus can scrape it)")
    dashboard_port: int | None = Field(None, ge=0, le=65535)
    usage_db: Path = Path(".gpuevents/usage.sqlite")
    usage_retention: Duration = Field(400 * 86400, description="usage rollups older than this are deleted")
    usage_hourly_for: Duration = Field(8 * 86400, description="hourly usage buckets older than this become daily")
    runners: int = Field(1, ge=0, description="action runners in the engine process")

    @field_validator("tick", "lease_ttl")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be greater than 0s")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {v!r}; use an IANA name like Asia/Shanghai") from None
        return v


# ---------------------------------------------------------------- actions
class SlackConfig(_Section):
    token_env: str = "SLACK_BOT_TOKEN"
    token_file: Path | None = None
    base_url: str | None = Field(None, description="Slack Web API base; for tests and proxies")
    digest_window: Duration = 0
    snooze_hint: bool = True
    app_token_env: str = Field("SLACK_APP_TOKEN", description="Socket Mode app token (xapp-…): button clicks "
                               "arrive over a websocket, no public endpoint")
    signing_secret_env: str = Field("SLACK_SIGNING_SECRET", description="for the HTTP interactivity endpoint")
    interactivity_port: int | None = Field(None, ge=0, le=65535, description="serve POST /slack/interactivity "
                                           "here (verifies Slack's signature); unset: Socket Mode only")
    admins: list[str] = Field(default_factory=list, description="Slack user ids who may answer any message")
    escalation_channel: str | None = Field(None, description="where `not_mine` clicks are posted")

    def app_token(self) -> str | None:
        value = os.environ.get(self.app_token_env)
        return value.strip() if value else None

    def signing_secret(self) -> str | None:
        value = os.environ.get(self.signing_secret_env)
        return value.strip() if value else None

    def token(self) -> str | None:
        """The bot token from the environment, else the token file; never from YAML."""
        value = os.environ.get(self.token_env)
        if value:
            return value.strip()
        if self.token_file is not None and self.token_file.exists():
            return self.token_file.read_text().strip() or None
        return None


class KubernetesConfig(_Section):
    kubeconfig: Path | None = None
    context: str | None = None
    in_cluster: bool | None = Field(None, description="unset: in-cluster when running in a pod")


class SlurmConfig(_Section):
    scontrol: Path = Path("scontrol")
    scancel: Path = Path("scancel")
    squeue: Path = Path("squeue")


class EmailConfig(_Section):
    """SMTP for the `email` action; the password comes from the environment (`password_env`), never the file."""

    host: str = "localhost"
    port: int = Field(25, ge=1, le=65535)
    sender: str = Field("gpuevents@localhost", description="the From address")
    starttls: bool = False
    tls: bool = Field(False, description="implicit TLS (port 465)")
    username: str | None = None
    password_env: str = "SMTP_PASSWORD"
    default_domain: str | None = Field(None, description="`to: alice` becomes alice@<domain>")


class RetryConfig(_Section):
    max_attempts: int = Field(5, ge=1)
    backoff: Duration = 2
    backoff_max: Duration = 300
    converge_for: Duration = 86400  # a remedy is retried while its incident is open, this long at most


class ActionsConfig(_Section):
    slack: SlackConfig = SlackConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    slurm: SlurmConfig = SlurmConfig()
    email: EmailConfig = EmailConfig()
    notify: NotifyConfig = NotifyConfig()
    retry: RetryConfig = RetryConfig()
    timeout: Duration = 30
    command_output_max: int = Field(4096, ge=0)


# ---------------------------------------------------------------- protect, costs
class GpuCost(_Section):
    price: float = Field(ge=0, description="purchase price per GPU")
    depreciation_years: float = Field(4, gt=0)
    rated_power_w: float = Field(300, ge=0)


class CostsConfig(_Section):
    currency: str = "USD"
    energy_price_kwh: float = Field(0.12, ge=0)
    pue: float = Field(1.0, ge=1)
    models: dict[str, GpuCost] = Field(default_factory=dict, description="by GPU model name, substring match")
    default: GpuCost = GpuCost(price=25000, depreciation_years=4, rated_power_w=700)
    team_label: str = "team"


class TeamConfig(_Section):
    target_util_pct: float | None = Field(None, ge=0, le=100, description="the utilization the team aims for")
    channel: str | None = Field(None, description="where the team's reports go, e.g. '#ml-research'")
    keeps_per_week: int | None = Field(None, ge=0, description="keeps the team may take per week before a keep "
                                       "waits for approval")


# ---------------------------------------------------------------- all
class Config(_Section):
    cluster: str = "default"
    nats: NatsConfig = NatsConfig()
    agent: AgentConfig = Field(default_factory=AgentConfig)
    engine: EngineConfig = EngineConfig()
    actions: ActionsConfig = ActionsConfig()
    owners: dict[str, str] = Field(default_factory=dict, description="user -> email or chat handle, or a "
                                   "mapping of addresses per service: {slack: …, email: …, teams: …}")
    owner_addresses: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="filled from the mapping form of `owners`: user -> service -> address")
    protect: ProtectConfig = ProtectConfig()
    costs: CostsConfig = CostsConfig()
    teams: dict[str, TeamConfig] = Field(default_factory=dict, description="per team: KPI target, channel")
    demand: DemandConfig = DemandConfig()
    keep_budget: KeepBudgetConfig = KeepBudgetConfig()

    @model_validator(mode="before")
    @classmethod
    def _owners_per_service(cls, data: Any) -> Any:
        """`owners: {alice: {slack: U1, email: a@x, teams: …}}`: the owner is the Slack address, else the email,
        else the user name (what rules see as `owner`); every address is kept for the `notify` action. The
        string form (`alice: alice@x`) stays as it was."""
        if not isinstance(data, dict) or not isinstance(data.get("owners"), dict):
            return data
        owners: dict[Any, Any] = {}
        addresses: dict[Any, Any] = dict(data.get("owner_addresses") or {})
        for user, value in data["owners"].items():
            if isinstance(value, Mapping):
                addresses[user] = dict(value)
                owners[user] = value.get("slack") or value.get("email") or user
            else:
                owners[user] = value
        return {**data, "owners": owners, "owner_addresses": addresses}

    def owner_address(self, owner: str, service: str) -> str | None:
        """`owner`'s address for `service`: `owner` is a user of `owners` or any of that user's addresses."""
        for user, addresses in self.owner_addresses.items():
            if owner == user or owner == self.owners.get(user) or owner in addresses.values():
                found = addresses.get(service)
                if found:
                    return found
        return None

    @model_validator(mode="after")
    def _cluster_name(self) -> Config:
        if not self.cluster:
            raise ValueError("cluster must not be empty")
        return self


def _find_secrets(data: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            if isinstance(k, str) and k.lower() in SECRET_KEYS:
                found.append((*path, k))
            found.extend(_find_secrets(v, (*path, k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found.extend(_find_secrets(v, (*path, i)))
    return found


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """Merge `GPUEVENTS_<SECTION>__<KEY>=value` into `data`; returns the variables used."""
    used = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX):
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX) :].split("__") if k]
        if not keys:
            continue
        target: dict[str, Any] = data
        for k in keys[:-1]:
            nxt = target.get(k)
            if not isinstance(nxt, dict):
                nxt = {}
                target[k] = nxt
            target = nxt
        target[keys[-1]] = parse_scalar(env[name])
        used.append(name)
    return used


def load_config(
    path: str | Path | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Read, override from the environment, validate. Errors: LocatedError (`file:line: key: problem`)."""
    env = os.environ if env is None else env
    if path is None:
        doc = YamlDoc(file="<defaults>", data={})
    else:
        p = Path(path)
        doc = parse_yaml(read_yaml_text(p, "config"), str(p))
    data = doc.data if doc.data is not None else {}
    if not isinstance(data, dict):
        raise LocatedError([doc.locate((), "a config file is a mapping of sections (cluster, nats, agent, ...)")])
    secrets = _find_secrets(data)
    if secrets:
        raise LocatedError(
            [
                doc.locate(s, f"{'.'.join(map(str, s))}: secrets never go in the config file; "
                "use the environment (e.g. SLACK_BOT_TOKEN) or a *_file key")
                for s in secrets
            ]
        )
    used = _apply_env(data, env)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        problems = doc.validation_problems(e)
        env_keys = {"__".join(n[len(ENV_PREFIX):].lower().split("__")): n for n in used}
        fixed: list[Located] = []
        for problem, err in zip(problems, e.errors(), strict=True):
            dotted = "__".join(str(x) for x in err["loc"] if isinstance(x, str))
            if dotted in env_keys:
                fixed.append(Located(f"env {env_keys[dotted]}", 0, problem.message))
            else:
                fixed.append(problem)
        raise LocatedError(fixed) from None

