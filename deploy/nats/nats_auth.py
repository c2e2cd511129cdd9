"""Generate NATS users for gpuevents: one per role (DESIGN §7.1), and one agent user per node.

Run it wherever gpuevents is installed (it uses `gpuevents.subjects` so that node names are
escaped exactly as agents escape them):

    python deploy/nats/nats_auth.py --cluster prod-a --out nats-auth gpu-01 gpu-02
    python deploy/nats/nats_auth.py --cluster hub --site site-a --site site-b=dc2 --out nats-auth \
        hub-gpu-01 site-a/gpu-0 site-b/gpu-0
    kubectl get nodes -l nvidia.com/gpu.present=true -o name | sed 's|node/||' \
        | python deploy/nats/nats_auth.py --cluster prod-a --out nats-auth --nodes-file -

It writes, under --out:

    auth.conf                     nats-server include: account GPUEVENTS with every user
    passwords/<role>              the password of engine, runner, operator and admin
    passwords/agents/<node>       one password per agent (the keys of the Kubernetes Secret)
    env/<role>.env                NATS_USER/NATS_PASSWORD for systemd's EnvironmentFile= (or a shell)
    env/agent-<node>.env          the same, per node
    kubernetes-secrets.yaml       the Secrets the Kubernetes manifests expect

Several clusters (docs/sites.md): `--cluster` again for one whose agents log in at the hub, `--site NAME[=DOMAIN]`
for one behind its own leaf server; `<cluster>/<node>` names a node of it. Each gets `sites/<cluster>/` with
its agents' passwords and env files, and a site its leaf's `auth.conf` (its agents only) and `leafnode.conf`.

Rerunning keeps the passwords already in --out (adding a node does not rotate the others) and
drops users for nodes no longer listed (removing a node revokes it). Delete a password file to
rotate that password.

Who may do what (checked against a real nats-server by tests/deploy/test_nats_permissions.py and
tests/deploy/test_nats_roles.py, and across leaf links by tests/deploy/test_nats_sites.py). Every role
subscribes to its own reply inbox only (`_INBOX.<role>.>`, an agent `_INBOX.agent.<cluster>.<node>.>`;
gpuevents connects each process with that prefix), so no one reads another's replies:

- agent (one per node): publish only `gpuevents.evt.<cluster>.<node>.>` (its events), subscribe only
  `gpuevents.cmd.<cluster>.<node>.>` (commands to its node), answer the requests it received.
  Other nodes' subjects, actions, the JetStream API and the KV bucket are denied.
- runner (`gpuevents runner`): the only role that commands agents (`gpuevents.cmd.>`), calls functions
  and publishes where rules say (the `publish` action): it may publish anywhere; it reads its inbox.
- engine (`gpuevents engine`): actions, audit, dead letters, the JetStream API and the KV bucket, and it
  answers `gpuevents.engine.>`. Its action runners run in its process (config engine.runners), so by
  default it may command agents too, and run `gpuevents runner` (as deploy/ runs them); with
  `--engine-without-runners` (engine.runners: 0, runners apart as the runner user) it may not.
- operator (the command line: status, audit, snooze, keep, free, kill, cancel): asks the engine on
  `gpuevents.engine.>` and reads the audit stream through consumers of its own names
  (`gpuevents-operator-<n>`), the only consumers it may create, read from or delete (an exporter's durable
  consumer on the audit stream is out of its reach); it can never reach `gpuevents.cmd.>`, the KV bucket
  nor the events. A person's kill or cancel is a request to the engine, decided like a rule's action.
- admin: everything (streams, backtests over the events, repairs).
- leaf/<site> (a site's leaf link to the hub): its own site's subjects only (leaf_permissions): a site can
  neither publish for another site nor hear another site's commands.

The account's JetStream use is bounded (--js-max-file, --js-max-mem), so no client fills the disk.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuevents.subjects import (
    KV_BUCKET,
    OPERATOR_CONSUMERS,
    PREFIX,
    STREAM_AUDIT,
    escape_token,
    inbox_prefix,
    jetstream_api,
    site_deliver_prefix,
)

ACCOUNT = "GPUEVENTS"
ROLE_USERS = {"engine": "gpuevents-engine", "runner": "gpuevents-runner",
              "operator": "gpuevents-operator", "admin": "gpuevents-admin"}
ENGINE_USER = ROLE_USERS["engine"]
# How long an agent may take to answer a command: a kill waits `grace` (30 s by default, set per
# rule) before SIGKILL and answers after; longer than any sane grace.
RESPONSE_EXPIRES = "15m"
# The account's JetStream bounds: what all of gpuevents may store, whoever publishes.
JS_MAX_FILE = "20G"
JS_MAX_MEM = "1G"
# Kubernetes Secret keys and file names: node names are DNS names, but bare-metal hosts may not be.
_SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SIZE = re.compile(r"^[0-9]+[KMGT]?$")

NATS_NAMESPACE = "nats"
NATS_AUTH_SECRET = "nats-gpuevents-auth"
GPUEVENTS_NAMESPACE = "gpuevents"
AGENT_SECRET = "gpuevents-agent-nats"
ENGINE_SECRET = "gpuevents-engine"
ROLES_SECRET = "gpuevents-nats-roles"  # the runner, operator and admin passwords, by role


@dataclass(frozen=True)
class Permissions:
    """The subjects one user may use; `responses`: it may answer the requests it receives."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responses: bool = False


AgentPermissions = Permissions


def agent_user(cluster: str, node: str) -> str:
    """The NATS user name of a node's agent (the DaemonSet sets NATS_USER to the same)."""
    return f"agent/{cluster}/{node}"


def agent_permissions(cluster: str, node: str) -> Permissions:
    c, n = escape_token(cluster), escape_token(node)
    return Permissions(
        publish=(f"{PREFIX}.evt.{c}.{n}.>",),
        subscribe=(f"{PREFIX}.cmd.{c}.{n}.>", f"{inbox_prefix('agent', node, cluster)}.>"),
        responses=True,
    )


def role_permissions(role: str, engine_runs_actions: bool = True, bucket: str = KV_BUCKET) -> Permissions | None:
    """What a role's user may do (None: everything, the admin)."""
    # the hub's JetStream, and each site's in its own domain (its store, created and sourced by the engine)
    jetstream = ("$JS.API.>", "$JS.*.API.>", "$JS.ACK.>", "$JS.FC.>", f"$KV.{bucket}.>")
    records = (f"{PREFIX}.act.>", f"{PREFIX}.audit.>", f"{PREFIX}.dlq.>")
    # Action runners command agents (kill), call functions, and publish where rules say (the `publish` action):
    # any subject. Only runners, and an engine that runs them in its process, have that.
    actions = (">",)
    if role == "admin":
        return None
    if role == "runner":
        return Permissions(publish=actions, subscribe=(f"{inbox_prefix('runner')}.>",))
    if role == "engine":
        # With its runners' rights, `gpuevents runner` may log in as the engine too (on the runners' inbox); and
        # `gpuevents status` where the engine runs (its login) reads what the engine answers it.
        runner_inbox = (f"{inbox_prefix('runner')}.>",) if engine_runs_actions else ()
        return Permissions(
            publish=actions if engine_runs_actions else (*records, *jetstream),
            subscribe=(f"{inbox_prefix('engine')}.>", *runner_inbox, f"{inbox_prefix('operator')}.>",
                       f"{PREFIX}.engine.>", f"{PREFIX}.audit.>"),
            responses=True,
        )
    if role == "operator":
        # the audit stream, through consumers of its own names only: an exporter's durable one stays out of reach
        audit = f"$JS.API.CONSUMER.%s.{STREAM_AUDIT}"
        own = [(f"{audit % 'CREATE'}.{name}", f"{audit % 'CREATE'}.{name}.>", f"{audit % 'MSG.NEXT'}.{name}",
                f"{audit % 'DELETE'}.{name}", f"{audit % 'INFO'}.{name}") for name in OPERATOR_CONSUMERS]
        return Permissions(
            publish=(f"{PREFIX}.engine.>", "$JS.API.INFO", f"$JS.API.STREAM.INFO.{STREAM_AUDIT}",
                     *(subject for names in own for subject in names)),
            subscribe=(f"{inbox_prefix('operator')}.>",),
        )
    raise ValueError(f"unknown role {role!r}")


def leaf_user(site: str) -> str:
    """The NATS user a site's leaf server logs in to the hub as."""
    return f"leaf/{site}"


def leaf_permissions(site: str, domain: str) -> Permissions:
    """A site's leaf link, seen from the hub: `publish` is what the site may send the hub, `subscribe` what the hub
    sends it. Its own site's subjects only (and the replies its agents and store give the engine, runners and admin)."""
    c = escape_token(site)
    return Permissions(
        publish=(f"{PREFIX}.evt.{c}.>", f"{site_deliver_prefix(site)}.>", "$JSC.R.>",
                 *(f"{inbox_prefix(role)}.>" for role in ("engine", "runner", "admin"))),
        subscribe=(f"{PREFIX}.cmd.{c}.>", f"{jetstream_api(domain)}.>", "$JS.FC.>", f"_INBOX.agent.{c}.>"),
    )


def check_node_name(node: str) -> str:
    if not _SAFE_NODE.fullmatch(node):
        raise ValueError(
            f"node name {node!r}: use letters, digits, '.', '_' and '-' (it names a file and a "
            "Kubernetes Secret key)"
        )
    return node


def _q(value: str) -> str:
    """A NATS config string: JSON quoting is valid there, and `$`/`>`/`%` stay literal inside quotes."""
    return json.dumps(value)


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_q(v) for v in values) + "]"


def _user(name: str, password: str, perms: Permissions | None) -> list[str]:
    if perms is None:
        return [f"      {{user: {_q(name)}, password: {_q(password)}}}"]
    lines = [
        f"      {{user: {_q(name)}, password: {_q(password)},",
        "       permissions: {",
        f"         publish: {{allow: {_list(perms.publish)}}},",
        f"         subscribe: {{allow: {_list(perms.subscribe)}}}" + ("," if perms.responses else ""),
    ]
    if perms.responses:
        lines.append(f"         allow_responses: {{max: 1, expires: {_q(RESPONSE_EXPIRES)}}}")
    return [*lines, "       }}"]


@dataclass(frozen=True)
class Site:
    """A cluster beside the first: its agents' passwords and, for a site behind its own leaf server, its JetStream
    domain and the password of its leaf link (None: its agents log in at the hub)."""

    name: str
    agents: dict[str, str]
    domain: str | None = None
    leaf_password: str | None = None


def _account(header: str, users: list[str], js_max_file: str, js_max_mem: str) -> str:
    lines = [
        f"# Generated by deploy/nats/nats_auth.py {header}; rerun it, do not edit.",
        "# Holds passwords: keep it as secret as a private key (a Kubernetes Secret, mode 0600).",
        "accounts: {",
        f"  {ACCOUNT}: {{",
        f"    jetstream: {{max_file: {js_max_file}, max_mem: {js_max_mem}}}",
        "    users: [",
        *users,
        "    ]", "  }", "}", "",
    ]
    return "\n".join(lines)


def _agents(cluster: str, agents: dict[str, str]) -> list[str]:
    return [line for node in sorted(agents) for line in _user(agent_user(cluster, node), agents[node],
                                                              agent_permissions(cluster, node))]


def render_auth_conf(cluster: str, roles: dict[str, str], agents: dict[str, str], *,
                     engine_runs_actions: bool = True, js_max_file: str = JS_MAX_FILE,
                     js_max_mem: str = JS_MAX_MEM, sites: Sequence[Site] = ()) -> str:
    """The hub's nats-server include: account GPUEVENTS with bounded JetStream, a user per role, one per agent of
    `cluster` and of the other clusters that log in at the hub, and one leaf link login per site behind a leaf
    server. `roles`: the password of each role in ROLE_USERS."""
    users = [
        "      # One user per role (DESIGN 7.1), each reading its own replies only (_INBOX.<role>; the engine's",
        "      # login also those of the runners it runs and of the status asked where it runs).",
    ]
    for role, user in ROLE_USERS.items():
        users += _user(user, roles[role], role_permissions(role, engine_runs_actions))
    users += _agents(cluster, agents)
    for site in sites:
        if site.domain is None:
            users += _agents(site.name, site.agents)
        else:
            assert site.leaf_password is not None
            users += [f"      # site {site.name}'s leaf server (JetStream domain {site.domain}): its own subjects only"]
            users += _user(leaf_user(site.name), site.leaf_password, leaf_permissions(site.name, site.domain))
    names = ", ".join(_q(c) for c in [cluster, *(s.name for s in sites)])
    return _account(f"for the hub of {names}" if sites else f"for cluster {_q(cluster)}", users, js_max_file,
                    js_max_mem)


def render_site_conf(site: Site, js_max_file: str = JS_MAX_FILE, js_max_mem: str = JS_MAX_MEM) -> str:
    """A site's leaf server include: account GPUEVENTS with its store's JetStream and its own agents only."""
    return _account(f"for site {_q(site.name)}'s leaf server", _agents(site.name, site.agents), js_max_file,
                    js_max_mem)


def render_leafnode_conf(site: Site, hub_url: str) -> str:
    """The leaf server's link to the hub, as `leaf/<site>` (include it in its config, whose jetstream block sets
    `domain` to the site's)."""
    assert site.leaf_password is not None and site.domain is not None
    scheme, _, host = hub_url.rpartition("://")
    url = f"{scheme or 'nats-leaf'}://{leaf_user(site.name).replace('/', '%2F')}:{site.leaf_password}@{host}"
    return "\n".join([
        f"# Generated by deploy/nats/nats_auth.py for site {_q(site.name)}; holds its link's password.",
        f"# The leaf's own config sets jetstream {{ domain: {_q(site.domain)} }}.",
        "leafnodes {",
        f"  remotes: [{{urls: [{_q(url)}], account: {ACCOUNT}}}]",
        "}", "",
    ])


def render_env(user: str, password: str) -> str:
    return f"NATS_USER={user}\nNATS_PASSWORD={password}\n"


def _secret(name: str, namespace: str, data: dict[str, str]) -> str:
    lines = [
        "---",
        "apiVersion: v1",
        "kind: Secret",
        "metadata:",
        f"  name: {name}",
        f"  namespace: {namespace}",
        "  labels: {app.kubernetes.io/part-of: gpuevents}",
        "type: Opaque",
        "stringData:",
    ]
    for key in sorted(data):
        value = data[key]
        if "\n" in value:
            lines.append(f"  {key}: |")
            lines += [f"    {line}" if line else "" for line in value.rstrip("\n").split("\n")]
        else:
            lines.append(f"  {key}: {_q(value)}")
    return "\n".join(lines) + "\n"


def render_kubernetes_secrets(auth_conf: str, roles: dict[str, str], agents: dict[str, str]) -> str:
    """The Secrets deploy/kubernetes and deploy/nats/values.yaml refer to, by name."""
    return "".join(
        [
            "# Generated by deploy/nats/nats_auth.py. Holds passwords: apply it, do not commit it.\n",
            _secret(NATS_AUTH_SECRET, NATS_NAMESPACE, {"auth.conf": auth_conf}),
            _secret(AGENT_SECRET, GPUEVENTS_NAMESPACE, dict(agents)),
            _secret(ENGINE_SECRET, GPUEVENTS_NAMESPACE, {"nats-password": roles["engine"]}),
            _secret(ROLES_SECRET, GPUEVENTS_NAMESPACE, {r: p for r, p in roles.items() if r != "engine"}),
        ]
    )


def _password(path: Path) -> str:
    """The password stored at `path`, or a new one (256 bits, URL-safe) written there."""
    if path.exists():
        value = path.read_text().strip()
        if value:
            return value
    value = secrets.token_urlsafe(32)
    _write_private(path, value + "\n")
    return value


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


@dataclass(frozen=True)
class Generated:
    auth_conf: Path
    engine_password: str
    agent_passwords: dict[str, str]
    role_passwords: dict[str, str]
    sites: dict[str, Site]  # the clusters beside the first, by name


def _passwords(directory: Path, names: Sequence[str]) -> dict[str, str]:
    """One password per name under `directory` (kept when already there); files of names no longer listed go."""
    kept = {name: _password(directory / name) for name in names}
    for stale in directory.iterdir() if directory.exists() else []:
        if stale.is_file() and stale.name not in kept:
            stale.unlink()
    return kept


def _write_envs(env_dir: Path, cluster: str, agents: dict[str, str]) -> None:
    for stale in env_dir.glob("agent-*.env") if env_dir.exists() else []:
        stale.unlink()
    for node, password in agents.items():
        _write_private(env_dir / f"agent-{node}.env", render_env(agent_user(cluster, node), password))


def split_nodes(first: str, nodes: Sequence[str], clusters: Sequence[str]) -> dict[str, list[str]]:
    """`<cluster>/<node>` to that cluster, a bare name to `first`; each cluster's nodes, sorted and checked."""
    by: dict[str, set[str]] = {c: set() for c in [first, *clusters]}
    for spec in nodes:
        cluster, _, node = spec.rpartition("/")
        if cluster and cluster not in by:
            raise ValueError(f"node name {spec!r}: cluster {cluster!r} is not given with --cluster or --site")
        by[cluster or first].add(check_node_name(node))
    return {c: sorted(n) for c, n in by.items()}


def generate(cluster: str, nodes: Sequence[str], out: Path, *, engine_runs_actions: bool = True,
             js_max_file: str = JS_MAX_FILE, js_max_mem: str = JS_MAX_MEM, clusters: Sequence[str] = (),
             sites: dict[str, str] | None = None, hub_url: str = "nats-leaf://hub:7422") -> Generated:
    """Write every file under `out` for `cluster` and `nodes`; see the module docstring. `clusters`: more
    clusters whose agents log in at the hub; `sites`: site -> JetStream domain of sites behind leaf servers."""
    sites = dict(sites or {})
    others = [*clusters, *sites]
    if not cluster or not all(others):
        raise ValueError("--cluster and --site must not be empty")
    if len({cluster, *others}) != 1 + len(others):
        raise ValueError("a cluster is named twice among --cluster and --site")
    for name, size in (("--js-max-file", js_max_file), ("--js-max-mem", js_max_mem)):
        if not _SIZE.fullmatch(size):
            raise ValueError(f"{name} {size!r}: a size such as 20G, 512M or 1000000")
    by_cluster = split_nodes(cluster, nodes, others)
    if not any(by_cluster.values()):
        raise ValueError("no nodes given: list them as arguments or with --nodes-file")
    roles = {role: _password(out / "passwords" / role) for role in ROLE_USERS}
    agents = _passwords(out / "passwords" / "agents", by_cluster[cluster])
    for role, user in ROLE_USERS.items():
        _write_private(out / "env" / f"{role}.env", render_env(user, roles[role]))
    _write_envs(out / "env", cluster, agents)
    extra = []
    for name in others:
        d = out / "sites" / name
        site = Site(name, _passwords(d / "passwords", by_cluster[name]), sites.get(name),
                    _password(out / "passwords" / "leaf" / name) if name in sites else None)
        _write_envs(d / "env", name, site.agents)
        if site.domain is not None:
            _write_private(d / "auth.conf", render_site_conf(site, js_max_file, js_max_mem))
            _write_private(d / "leafnode.conf", render_leafnode_conf(site, hub_url))
        extra.append(site)
    auth = render_auth_conf(cluster, roles, agents, engine_runs_actions=engine_runs_actions,
                            js_max_file=js_max_file, js_max_mem=js_max_mem, sites=extra)
    _write_private(out / "auth.conf", auth)
    _write_private(out / "kubernetes-secrets.yaml", render_kubernetes_secrets(auth, roles, agents))
    return Generated(out / "auth.conf", roles["engine"], agents, roles, {s.name: s for s in extra})


def _read_nodes(args: argparse.Namespace) -> list[str]:
    nodes = list(args.nodes)
    if args.nodes_file is not None:
        text = sys.stdin.read() if args.nodes_file == "-" else Path(args.nodes_file).read_text()
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip().removeprefix("node/")
            if line:
                nodes.append(line)
    return nodes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("nodes", nargs="*", help="node names, as the agents report them; <cluster>/<node> for a "
                        "node of another cluster than the first")
    parser.add_argument("--cluster", required=True, action="append",
                        help="the config's `cluster` value; again for another cluster whose agents log in here")
    parser.add_argument("--site", action="append", default=[], metavar="NAME[=DOMAIN]",
                        help="a site behind its own leaf nats-server, JetStream domain DOMAIN (default NAME)")
    parser.add_argument("--hub-url", default="nats-leaf://hub:7422",
                        help="where sites' leaf servers reach the hub (their leafnode.conf)")
    parser.add_argument("--nodes-file", help="a file with one node name a line ('-': stdin)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (kept private)")
    parser.add_argument("--engine-without-runners", action="store_true",
                        help="the engine may not command agents (run it with engine.runners: 0 and "
                        "`gpuevents runner` apart, as the runner user)")
    parser.add_argument("--js-max-file", default=JS_MAX_FILE,
                        help=f"the account's JetStream disk (default {JS_MAX_FILE})")
    parser.add_argument("--js-max-mem", default=JS_MAX_MEM,
                        help=f"the account's JetStream memory (default {JS_MAX_MEM})")
    args = parser.parse_args(argv)
    try:
        sites = dict((spec.partition("=")[0], spec.partition("=")[2] or spec.partition("=")[0])
                     for spec in args.site)
        result = generate(args.cluster[0], _read_nodes(args), args.out,
                          engine_runs_actions=not args.engine_without_runners, js_max_file=args.js_max_file,
                          js_max_mem=args.js_max_mem, clusters=args.cluster[1:], sites=sites, hub_url=args.hub_url)
    except (ValueError, OSError) as e:
        print(f"nats_auth: {e}", file=sys.stderr)
        return 2
    agents = len(result.agent_passwords) + sum(len(s.agents) for s in result.sites.values())
    print(f"wrote {result.auth_conf} and the secrets for {agents} agents, the engine, runner, operator and "
          f"admin" + (f", and the files of {len(result.sites)} more clusters under sites/" if result.sites else "")
          + f" under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
