"""`wingsmith workloads|deployments|discovered|projects|clusters …`: the REST API from the shell.

Each command is one API call (two for `serving` flags, which change the current config), printed
as a table, as `key: value` lines for one resource, or as the API's JSON with `--json`. `--wait`
follows a workload with a progress bar until its replicas are ready on its current serving
config, and exits 2 saying why when it gives up (services/cli/waiting.py). The API is
found at WINGSMITH_API_URL (else where `wingsmith up` wrote it, else http://127.0.0.1:8080) and
the token in WINGSMITH_API_TOKEN (else the one `wingsmith up` keeps in the data directory).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from wingsmith.domain.deployment import AdmissionPhase, Authority
from wingsmith.domain.placement import Strategy
from wingsmith.domain.values import Backend, ServingMode
from wingsmith.services.cli.podflags import add_pod_flags, pod_from
from wingsmith.services.cli.terminal import Progress, table
from wingsmith.services.cli.waiting import Readiness, Target, follow
from wingsmith.services.config import API_TOKEN_FILE, API_URL_FILE, data_dir_from

if TYPE_CHECKING:  # the API's documents, as types only: the command line starts without them
    from typing_extensions import TypeIs

    from wingsmith.domain.contracts import views as v
    from wingsmith.domain.contracts.replies import Accepted

DEFAULT_URL = "http://127.0.0.1:8080"
REQUIRED = (
    "workload_id",
    "project",
    "device_class",
    "replicas",
    "model",
    "backend",
    "devices_per_replica",
)
# One of these says which Dynamo runtime runs the model; the release is the one to give.
VERSION_FLAGS = ("runtime_release", "engine_version")
Run = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


class ApiClient:
    def __init__(self, base_url: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ApiClient:
        env = dict(os.environ) if env is None else env
        data_dir = data_dir_from(env)
        url = env.get("WINGSMITH_API_URL") or _read(data_dir / API_URL_FILE) or DEFAULT_URL
        token = env.get("WINGSMITH_API_TOKEN") or _read(data_dir / API_TOKEN_FILE)
        return cls(url.rstrip("/"), token)

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        *,
        none_if_missing: bool = False,
    ) -> Any:
        """The response's JSON; a problem (or no answer) raises RuntimeError saying what (a
        404 is None instead, if asked)."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = await self._http.request(method, path, json=body, params=query)
        except httpx.HTTPError as e:
            raise RuntimeError(f"cannot reach the API at {self.base_url}: {e}") from None
        if response.status_code == 404 and none_if_missing:
            return None
        if response.status_code >= 400:
            raise RuntimeError(_problem(response))
        return response.json()

    async def close(self) -> None:
        await self._http.aclose()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _problem(response: httpx.Response) -> str:
    try:
        problem = response.json()
        where = f" ({problem['field']})" if problem.get("field") else ""
        text = f"{response.status_code} {problem['code']}{where}: {problem['detail']}"
        if problem.get("candidates"):
            text += f"; candidates: {', '.join(problem['candidates'])}"
        return text
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:500]}"


def _command(run: Callable[[ApiClient, argparse.Namespace], Coroutine[Any, Any, Any]]) -> Run:
    """A subcommand: open a client, run, print the result (a table, a resource, or JSON)."""

    async def command(args: argparse.Namespace) -> int:
        api = ApiClient.from_env()
        try:
            shown = await run(api, args)
        finally:
            await api.close()
        if shown is not None:
            print(shown)
        return 0

    return command


def _out(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> str:
    """JSON with --json; else `text`, or the hub's result when the API answered with it (202:
    the change is stored, the views do not show it yet)."""
    if args.json:
        return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    return _fields(data) if _accepted(data) else text(data)


def _accepted(answer: Mapping[str, Any]) -> TypeIs[Accepted]:
    """Whether a write was answered `202`: stored, and not in the views yet."""
    return answer.get("consistent") is False


def _fields(resource: Mapping[str, Any], prefix: str = "") -> str:
    """One resource as `key: value` lines: nested objects indented, lists of objects as a
    table."""
    lines = []
    for key, value in resource.items():
        if isinstance(value, dict) and value:
            lines += [f"{prefix}{key}:", _fields(value, prefix + "  ")]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            rows = [[_cell(v.get(column)) for column in value[0]] for v in value]
            shown = table([c.upper() for c in value[0]], rows)
            lines += [f"{prefix}{key}:", *(f"{prefix}  {line}" for line in shown.splitlines())]
        else:
            lines.append(f"{prefix}{key}: {_cell(value)}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


# Workloads


def _workload_table(found: v.WorkloadList) -> str:
    rows = [
        (
            _named(w),
            w["project"],
            w["device_class"],
            w["replicas"],
            sum(d["ready_replicas"] or 0 for d in w["deployments"]),
            w["phase"],
            ", ".join(f"{d['cluster_id']}:{d['admission_phase']}" for d in w["deployments"])
            or w["unplaced"],
        )
        for w in found["workloads"]
    ]
    headers = ("WORKLOAD", "PROJECT", "CLASS", "REPLICAS", "READY", "PHASE", "DEPLOYMENTS")
    return table(headers, rows)


def _named(w: v.Workload) -> str:
    """The workload's name; `#<n>` after it for a later incarnation of the name."""
    return w["name"] if w["incarnation"] == 1 else f"{w['name']} #{w['incarnation']}"


async def _list_workloads(api: ApiClient, args: argparse.Namespace) -> str:
    params = {"project": args.project, "phase": args.phase}
    found = await api.call("GET", "/v1/workloads", params=params)
    return _out(args, found, _workload_table)


async def _get(api: ApiClient, args: argparse.Namespace) -> str:
    return _out(args, await api.call("GET", f"{args.collection}/{args.ref}"), _fields)


def _serving_from(args: argparse.Namespace, current: dict[str, Any] | None = None) -> Any:
    """The serving config from a file, or the flags given over `current` (or nothing)."""
    if args.file:
        return _load(args.file)
    serving = dict(current or {})
    if args.runtime_release is not None and args.engine_version is None:
        serving.pop("engine_version", None)  # it defaults to what the new release ships
    for flag in SERVING_FLAGS:
        if getattr(args, flag) is not None:
            serving[flag] = getattr(args, flag)
    if args.tensor is not None:
        serving["parallelism"] = dict(serving.get("parallelism") or {}) | {"tensor": args.tensor}
    if (pod := pod_from(args, serving.get("pod"))) is not None:
        serving["pod"] = pod
    return serving


SERVING_FLAGS = (
    "model",
    "backend",
    "runtime_release",
    "engine_version",
    "image",
    "mode",
    "devices_per_replica",
    "context_length",
)


def _load(path: str) -> Any:
    import yaml  # only for --file: the other commands need not load it

    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        return yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: neither JSON nor YAML: {e}") from None


async def _create_workload(api: ApiClient, args: argparse.Namespace) -> str | None:
    """From --file (the whole request), or from the flags."""
    if args.file:
        body = _load(args.file)
    else:
        missing = [f for f in REQUIRED if getattr(args, f) is None]
        if all(getattr(args, f) is None for f in VERSION_FLAGS):
            missing.append(VERSION_FLAGS[0])
        if missing:
            flags = ", ".join(
                "NAME" if f == "workload_id" else "--" + f.replace("_", "-") for f in missing
            )
            raise ValueError(f"give --file, or {flags}")
        body = {
            "workload_id": args.workload_id,
            "project": args.project,
            "device_class": args.device_class,
            "replicas": args.replicas,
            "serving": _serving_from(args),
        }
        if args.cluster:
            body["cluster"] = args.cluster
        body |= _preferences_from(args)
    created = await api.call("POST", "/v1/workloads", body)
    return await _then_wait(api, args, created)


def _preferences_from(args: argparse.Namespace) -> dict[str, Any]:
    """--prefer A,B  --selector key=value (repeated)  --strategy pack|spread: only those given."""
    found: dict[str, Any] = {}
    if args.prefer:
        found["preferred_clusters"] = [c for c in args.prefer.split(",") if c]
    if args.selector:
        pairs = [pair.partition("=") for pair in args.selector]
        bad = [key for key, eq, _ in pairs if not eq]
        if bad:
            raise ValueError(f"--selector takes key=value, not {bad[0]!r}")
        found["cluster_selector"] = {key: value for key, _, value in pairs}
    if args.strategy:
        found["strategy"] = args.strategy
    return found


async def _prefer(api: ApiClient, args: argparse.Namespace) -> str:
    """Replaces the workload's preferences with what is given (nothing: placement's default)."""
    changed = await api.call(
        "PUT", f"/v1/workloads/{args.ref}/preferences", _preferences_from(args)
    )
    return _out(args, changed, _fields)


def _preference_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prefer", metavar="CLUSTERS", help="clusters to try first: a,b,c")
    parser.add_argument(
        "--selector",
        action="append",
        metavar="KEY=VALUE",
        help="only clusters with this label (repeat for more)",
    )
    parser.add_argument(
        "--strategy",
        choices=[s.value for s in Strategy],
        help="pack: fill one cluster, then the next (default); spread: as even as room allows",
    )


async def _scale(api: ApiClient, args: argparse.Namespace) -> str | None:
    path = f"/v1/workloads/{args.ref}/scale"
    scaled = await api.call("POST", path, {"replicas": args.replicas})
    return await _then_wait(api, args, scaled)


async def _serving(api: ApiClient, args: argparse.Namespace) -> str | None:
    current = await api.call("GET", f"/v1/workloads/{args.ref}")
    serving = _serving_from(args, current["serving"])
    changed = await api.call("PUT", f"/v1/workloads/{args.ref}/serving", {"serving": serving})
    return await _then_wait(api, args, changed)


async def _delete(api: ApiClient, args: argparse.Namespace) -> str | None:
    deleted = await api.call("DELETE", f"/v1/workloads/{args.ref}")
    return _out(
        args,
        deleted,
        lambda d: f"deleted {d.get('name', d['workload_id'])}: {', '.join(d['deployments'])}",
    )


async def _then_wait(
    api: ApiClient, args: argparse.Namespace, workload: v.Workload | Accepted
) -> str:
    if args.wait:
        workload = await wait_until_ready(api, _target(workload), args.timeout)
    return _out(args, workload, _fields)


def _target(answer: v.Workload | Accepted) -> Target:
    """What the write asked for, as its answer says it; a 202's views do not show it yet."""
    said = answer["result"] if _accepted(answer) else answer
    key = said.get("name") or said["workload_id"]  # a receipt stored before names: the id
    replicas, digest = said["replicas"], said["serving_digest"]
    return Target(key, replicas, digest, shown=not _accepted(answer))


async def wait_until_ready(api: ApiClient, target: Target, timeout: float) -> v.Workload:
    """Follow the workload until its replicas are ready on its current serving config
    (services/cli/waiting.py); a bar shows them, with why the rest are not ready yet."""
    key = target.name

    async def look() -> tuple[v.Workload | None, list[v.Deployment]]:
        workload = await api.call("GET", f"/v1/workloads/{key}", none_if_missing=True)
        if workload is None:  # not in the views yet, or deleted
            return None, []
        found = await api.call("GET", "/v1/deployments", params={"workload": key})
        return workload, found["deployments"]

    bar = Progress(key, 1)

    def show(state: Readiness) -> None:
        bar.total = max(state.wanted, 1)
        bar.update(state.ready, state.note)

    try:
        return await follow(look, target, timeout, show)
    finally:
        bar.close()


# Deployments


def _deployment_table(found: v.DeploymentList) -> str:
    rows = [
        (
            d["deployment_id"],
            d["cluster_id"],
            d["admission_phase"],
            d["admission_reason"],
            f"{d['ready_replicas']}/{d['desired_replicas']}",
            d["waiting_replicas"],
            d["authority"],
            "yes" if d["enabled"] else "no",
            d["status"]["phase"] if d["status"] else None,
            _conditions(d["status"]),
            ", ".join(f"{k}:{v}" for k, v in d["live_digests"].items()),
        )
        for d in found["deployments"]
    ]
    headers = ("DEPLOYMENT", "CLUSTER", "PHASE", "REASON", "READY", "WAITING", "AUTHORITY")
    return table((*headers, "ENABLED", "STATUS", "CONDITIONS", "LIVE DIGESTS"), rows)


_MESSAGE_SHOWN = 80  # of a permanent condition's message, in a table cell


def _conditions(status: v.ClusterStatus | None) -> str:
    """What is wrong, as the cluster says: a transient reason with the pods showing it, a
    permanent one with its message (whole in `--json`)."""
    shown = []
    for c in status.get("conditions", []) if status else []:
        if c["permanent"]:
            message = c["message"] or ""
            cut = message if len(message) <= _MESSAGE_SHOWN else message[: _MESSAGE_SHOWN - 1] + "…"
            shown.append(f"{c['reason']}: {cut}" if cut else c["reason"])
        else:
            pods = c["pods"]
            shown.append(f"{c['reason']} ({pods} pod{'s' * (pods != 1)})" if pods else c["reason"])
    return ", ".join(shown)


async def _list_deployments(api: ApiClient, args: argparse.Namespace) -> str:
    params = {"workload": args.workload, "cluster": args.cluster}
    return _out(args, await api.call("GET", "/v1/deployments", params=params), _deployment_table)


async def _deployment_action(api: ApiClient, args: argparse.Namespace) -> str:
    path = f"/v1/deployments/{args.ref}/{args.action}"
    if args.action == "authority":
        body: Any = {"authority": Authority.MANAGED, "force": args.force}
        method = "POST"
    elif args.action == "engine-args":
        body, method = {"engine_args": args.engine_args}, "PUT"
    else:
        body, method = None, "POST"
    return _out(args, await api.call(method, path, body), _fields)


async def _explain(api: ApiClient, args: argparse.Namespace) -> str:
    found = await api.call("GET", f"/v1/deployments/{args.ref}/explain")
    return _out(args, found, explanation_text)


def explanation_text(e: v.Explanation) -> str:
    """An explanation as a person reads it: what it is, wants, holds and waits for, why, with
    the numbers, and what would unblock it."""
    what = e["deployment_id"] or f"workload {e['workload_id']} (not placed)"
    lines = [
        f"{what}: {e['summary']}",
        f"  project {e['project']}, device class {e['device_class']}, phase {e['phase']}",
        f"  wants {_amount(e['wants'])}; holds {_amount(e['holds'])}; "
        f"waiting {_amount(e['waiting'])}",
    ]
    constraint = e["constraint"]
    if constraint is not None:
        lines += _constraint("why", constraint)
    if "blocked_by" in e:
        lines += _constraint("ahead of it", e["blocked_by"])
    if e["unblock"]:
        lines.append("to unblock it:")
        lines += [f"  - {change}" for change in e["unblock"]]
    return "\n".join(lines)


def _amount(amount: v.Amount) -> str:
    return f"{amount['replicas']} replicas ({amount['devices']} devices)"


def _constraint(title: str, c: v.Constraint) -> list[str]:
    lines = [f"{title}: {c['reason']}: {c['message']}"]
    if c["numbers"]:
        lines.append("  " + ", ".join(f"{k}={n}" for k, n in c["numbers"].items()))
    if "nodes_free" in c:
        free = ", ".join(f"{node}={n}" for node, n in c["nodes_free"].items())
        lines.append(f"  free per node: {free}")
    if c.get("did_you_mean"):
        lines.append(f"  did you mean: {', '.join(c.get('did_you_mean', []))}")
    if "reported" in c:
        lines.append(f"  reported: {', '.join(c['reported']) or 'none'}")
    return lines


# Discovered models


def _discovered_table(found: v.DiscoveredList) -> str:
    rows = [
        (
            d["discovery_id"],
            d["cluster_id"],
            f"{d['namespace']}/{d['name']}",
            d["state"],
            "yes" if d["present"] else "no",
            d.get("model"),
            d["workload_id"],
        )
        for d in found["discovered"]
    ]
    headers = ("DISCOVERY", "CLUSTER", "OBJECT", "STATE", "RUNNING", "MODEL", "WORKLOAD")
    return table(headers, rows)


async def _list_discovered(api: ApiClient, args: argparse.Namespace) -> str:
    params = {"include_ignored": "true" if args.all else None, "cluster": args.cluster}
    return _out(args, await api.call("GET", "/v1/discovered", params=params), _discovered_table)


async def _discovered_action(api: ApiClient, args: argparse.Namespace) -> str:
    path = f"/v1/discovered/{args.ref}/{args.action}"
    body = None
    if args.action == "promote":
        body = {"project": args.project}
        for field in ("workload_id", "device_class"):
            if getattr(args, field):
                body[field] = getattr(args, field)
    return _out(args, await api.call("POST", path, body), _fields)


# Projects, clusters, capacity


def _project_table(found: v.ProjectList) -> str:
    """USED is what admission counts against the quota: ALLOCATED (live replicas) and RESERVED
    (granted, not started yet)."""
    rows = [
        (
            p["project"],
            q["device_class"],
            q["quota"],
            q["used"],
            q["allocated"],
            q["reserved"],
            q["available"],
        )
        for p in found["projects"]
        for q in p["quotas"]
    ]
    headers = ("PROJECT", "CLASS", "QUOTA", "USED", "ALLOCATED", "RESERVED", "AVAILABLE")
    return table(headers, rows)


async def _list_projects(api: ApiClient, args: argparse.Namespace) -> str:
    return _out(args, await api.call("GET", "/v1/projects"), _project_table)


async def _quota(api: ApiClient, args: argparse.Namespace) -> str:
    path = f"/v1/projects/{args.project}/quotas/{args.device_class}"
    project = await api.call("PUT", path, {"devices": args.devices})
    return _out(args, project, lambda p: _project_table({"projects": [p]}))


CAPACITY_COLUMNS = (
    "device_class",
    "total",
    "unschedulable",
    "held_outside",
    "allocated",
    "reserved",
    "free",
)
CAPACITY_HEADERS = ("CLASS", "TOTAL", "UNSCHED", "OUTSIDE", "ALLOCATED", "RESERVED", "FREE")


def _cluster_table(found: v.ClusterList) -> str:
    """FREE = TOTAL - UNSCHED - OUTSIDE - ALLOCATED - RESERVED, as admission counts it:
    negative when over-committed."""
    rows = [
        (
            c["cluster_id"],
            "yes" if c["reachable"] else "no",
            _operator(c["operator"]),
            c["nodes"],
            *(row[column] for column in CAPACITY_COLUMNS),
        )
        for c in found["clusters"]
        for row in _capacity_rows(c)
    ]
    return table(("CLUSTER", "REACHABLE", "OPERATOR", "NODES", *CAPACITY_HEADERS), rows)


def _node_table(found: v.NodeList) -> str:
    """FREE = DEVICES - OUTSIDE - ALLOCATED on a schedulable node, -ALLOCATED on another."""
    rows = [
        (
            n["node_id"],
            n["device_class"],
            n["devices"],
            "yes" if n["unschedulable"] else "no",
            n["held_outside"],
            n["allocated"],
            n["free"],
        )
        for n in found["nodes"]
    ]
    headers = ("NODE", "CLASS", "DEVICES", "UNSCHED", "OUTSIDE", "ALLOCATED", "FREE")
    return table(headers, rows)


async def _list_nodes(api: ApiClient, args: argparse.Namespace) -> str:
    path = f"/v1/clusters/{args.ref}/nodes"
    found = await api.call("GET", path, params={"device_class": args.device_class})
    return _out(args, found, _node_table)


def _capacity_rows(cluster: v.Cluster) -> Sequence[Mapping[str, Any]]:
    """A cluster's capacity rows; one of blanks when it has none, so the cluster is listed."""
    return cluster["capacity"] or [dict.fromkeys(CAPACITY_COLUMNS)]


def _operator(operator: v.OperatorDocument | None) -> str:
    if operator is None:
        return "-"
    modes = [m for m in ("read_only", "simulated") if operator.get(m)]
    return str(operator["version"]) + (f" ({', '.join(modes)})" if modes else "")


async def _list_clusters(api: ApiClient, args: argparse.Namespace) -> str:
    return _out(args, await api.call("GET", "/v1/clusters"), _cluster_table)


class _Nouns:
    """Adds `wingsmith <noun> <verb>` commands, each with `--json`."""

    def __init__(self, sub: Any) -> None:
        self.sub = sub
        self.json_flag = argparse.ArgumentParser(add_help=False)
        self.json_flag.add_argument("--json", action="store_true", help="print the API's JSON")

    def noun(self, name: str, help: str) -> Any:
        return self.sub.add_parser(name, help=help).add_subparsers(required=True, metavar="ACTION")

    def verb(self, group: Any, name: str, run: Any, help: str, **defaults: Any) -> Any:
        parser = group.add_parser(name, help=help, parents=[self.json_flag])
        parser.set_defaults(run=_command(run), **defaults)
        return parser


def add_commands(sub: Any) -> None:
    """The resource commands, on the CLI's subparsers."""
    nouns = _Nouns(sub)
    for add in (_workloads, _deployments, _discovered, _projects, _clusters):
        add(nouns)


def _workloads(cli: _Nouns) -> None:
    workloads = cli.noun("workloads", "declare, scale, change and delete workloads (REST API)")
    listed = cli.verb(workloads, "list", _list_workloads, "every workload with its phase")
    listed.add_argument("--project")
    listed.add_argument("--phase", choices=[p.value for p in AdmissionPhase])
    got = cli.verb(workloads, "get", _get, "one workload", collection="/v1/workloads")
    got.add_argument("ref", help="the workload's name")
    create = cli.verb(workloads, "create", _create_workload, "declare a workload")
    create.add_argument("workload_id", metavar="NAME", nargs="?")
    create.add_argument("--project")
    create.add_argument("--device-class", help="e.g. NVIDIA-H100-80GB-HBM3")
    create.add_argument("--replicas", type=int)
    create.add_argument("--cluster", help="pin it to this cluster")
    _preference_flags(create)
    _serving_flags(create, file="the whole request (JSON or YAML; - for stdin)")
    _wait_flags(create)
    scale = cli.verb(workloads, "scale", _scale, "change the total replicas")
    scale.add_argument("ref", help="the workload's name")
    scale.add_argument("replicas", type=int)
    _wait_flags(scale)
    serving = cli.verb(
        workloads,
        "serving",
        _serving,
        "change the serving config (a rollout, unless only where pods run or the frontend change)",
    )
    serving.add_argument("ref", help="the workload's name")
    _serving_flags(serving, file="the serving config (JSON or YAML; - for stdin)")
    _wait_flags(serving)
    prefer = cli.verb(
        workloads, "prefer", _prefer, "set where its replicas should rather run (moves follow)"
    )
    prefer.add_argument("ref", help="the workload's name")
    _preference_flags(prefer)
    delete = cli.verb(workloads, "delete", _delete, "delete it and its deployments")
    delete.add_argument("ref", help="the workload's name")


def _deployments(cli: _Nouns) -> None:
    deployments = cli.noun("deployments", "deployments: status, replicas, authority (REST API)")
    listed = cli.verb(deployments, "list", _list_deployments, "every deployment and its status")
    listed.add_argument("--workload")
    listed.add_argument("--cluster")
    got = cli.verb(deployments, "get", _get, "one deployment", collection="/v1/deployments")
    got.add_argument("ref", help="an id (llama--east) or llama/east, or a workload's name")
    explained = cli.verb(
        deployments, "explain", _explain, "why it waits, in numbers, and what would unblock it"
    )
    explained.add_argument("ref", help="a deployment, or a workload not placed anywhere")
    for action, help in (("enable", "reconcile it again"), ("disable", "scale it to zero")):
        cli.verb(deployments, action, _deployment_action, help, action=action).add_argument("ref")
    promote = cli.verb(
        deployments, "promote", _deployment_action, "observed -> managed", action="authority"
    )
    promote.add_argument("ref")
    promote.add_argument("--force", action="store_true", help="even if engine_args differ")
    args = cli.verb(
        deployments, "engine-args", _deployment_action, "set engine args", action="engine-args"
    )
    args.add_argument("ref")
    args.add_argument("engine_args", nargs="*", metavar="ARG", help="after --, e.g. -- --foo 1")


def _discovered(cli: _Nouns) -> None:
    discovered = cli.noun("discovered", "models found running that nobody declared (REST API)")
    listed = cli.verb(discovered, "list", _list_discovered, "sightings (not ignored ones)")
    listed.add_argument("--all", action="store_true", help="ignored ones too")
    listed.add_argument("--cluster")
    got = cli.verb(discovered, "get", _get, "one sighting", collection="/v1/discovered")
    got.add_argument("ref", help="an id, or the object's name (namespace/name)")
    for action, help in (("track", "keep it, observed only"), ("ignore", "hide it")):
        cli.verb(discovered, action, _discovered_action, help, action=action).add_argument("ref")
    adopt = cli.verb(discovered, "promote", _discovered_action, "adopt it", action="promote")
    adopt.add_argument("ref")
    adopt.add_argument("--project", required=True)
    adopt.add_argument("--workload-id", help="default: the object's name")
    adopt.add_argument("--device-class", help="default: the cluster's one class")


def _projects(cli: _Nouns) -> None:
    projects = cli.noun("projects", "projects and their quotas (REST API)")
    cli.verb(projects, "list", _list_projects, "quota and use per device class")
    got = cli.verb(projects, "get", _get, "one project", collection="/v1/projects")
    got.add_argument("ref", metavar="project")
    quota = cli.verb(projects, "quota", _quota, "set a quota")
    quota.add_argument("project")
    quota.add_argument("device_class")
    quota.add_argument("devices", type=int)


def _clusters(cli: _Nouns) -> None:
    clusters = cli.noun("clusters", "clusters, their operators and capacity (REST API)")
    cli.verb(clusters, "list", _list_clusters, "every cluster with its devices")
    got = cli.verb(clusters, "get", _get, "one cluster", collection="/v1/clusters")
    got.add_argument("ref", metavar="cluster")
    nodes = cli.verb(clusters, "nodes", _list_nodes, "its nodes: devices, held and free")
    nodes.add_argument("ref", metavar="cluster")
    nodes.add_argument("--device-class")


def _serving_flags(parser: argparse.ArgumentParser, *, file: str) -> None:
    parser.add_argument("--file", help=file)
    parser.add_argument("--model")
    parser.add_argument("--backend", choices=[b.value for b in Backend])
    parser.add_argument(
        "--runtime-release",
        help="the Dynamo runtime release, e.g. 1.3.1: picks the image and the engine's flags "
        "(docs/operator.md#dynamo-runtime-releases lists them)",
    )
    parser.add_argument(
        "--engine-version", help="the engine's own version; by default what the release ships"
    )
    parser.add_argument("--devices-per-replica", type=int)
    parser.add_argument("--tensor", type=int, help="tensor parallelism")
    parser.add_argument("--mode", choices=[m.value for m in ServingMode])
    parser.add_argument("--image")
    parser.add_argument("--context-length", type=int)
    add_pod_flags(parser)


def _wait_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        action="store_true",
        help="follow it until every replica is ready on its current serving config (a bar, "
        "with why not yet); exit 2 with the reason at a failure or the timeout",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to --wait")
