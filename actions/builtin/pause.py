"""The `pause` and `resume` actions' runtime: stop a Kubernetes job's top owner the way its kind is stopped
(replicas to 0, spec.suspend, runPolicy.suspend, the Notebook's stop annotation, KServe minReplicas 0), remember
exactly what was changed (KV, and on the object as the `gpuevents.io/paused` annotation, so resume works from the
cluster alone), and set exactly that back; a Kubernetes Event on the workload for each. A pause or resume that
changes several objects (a CronJob and its running Jobs) is all or nothing: when one patch fails, those already
made are set back before the error is reported.

Refused: a job id that is not `<namespace>/<Kind>/<name>`, a bare pod (no controller to stop: `cancel` deletes
it), a protected namespace or workload label, an owner that is not the one decided on (its uid, or its
generation: changed since), a kind that cannot be paused and has no owner below it that can."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube.types import PatchType

from actions.errors import PermanentError, TransientError
from actions.kube import kube_errors, post_event
from actions.pauseplan import (
    PAUSED,
    PAUSED_BY,
    Change,
    Paused,
    PauseRecord,
    describe,
    merge_patch,
    pause_changes,
    record_on,
    resume_changes,
    with_annotation,
)
from actions.protocol import ActionContext, ActionResult
from actions.specs.pause import PauseParams, PauseSpec, ResumeParams, ResumeSpec
from actions.store import kv_key
from gpuevents.facts import Facts, JobFacts
from gpuevents.kube import resource_for
from gpuevents.kubekinds import KINDS, Kind, kind_of, split_job_id

__all__ = ["PAUSED", "PAUSED_BY", "PauseAction", "ResumeAction"]


def job_of(job_param: str | None, facts: Facts) -> tuple[str | None, JobFacts]:
    """The job to pause or resume (the parameter, else the request's job, else its GPU's or process's) and what
    the request says of it (its controller's uid and generation, its pods)."""
    job = facts.job or JobFacts()
    if job_param:
        return job_param.strip(), job
    if job.id and job.scheduler in (None, "kubernetes"):
        return job.id, job
    for candidate in (facts.gpu.job if facts.gpu else None, facts.process.job if facts.process else None):
        if candidate and split_job_id(candidate):
            return candidate, JobFacts(id=candidate)
    return job.id, job


def record_key(job: str) -> str:
    return kv_key("actions", "pause", job)


async def _read(ctx: ActionContext, k: Kind, namespace: str, name: str) -> dict[str, Any] | None:
    from lightkube import ApiError

    client = ctx.services.kube()
    with kube_errors(f"get {k.kind} {namespace}/{name}"):
        try:
            obj = await client.get(resource_for(k.api_version, k.kind), name, namespace=namespace)
        except ApiError as e:
            if (e.status.code or e.response.status_code) == 404:
                return None
            raise
    out: dict[str, Any] = obj.to_dict()
    out.setdefault("apiVersion", k.api_version)
    out.setdefault("kind", k.kind)
    return out


async def _patch(ctx: ActionContext, k: Kind, obj: Mapping[str, Any],
                 values: list[tuple[list[str], Any]]) -> dict[str, Any]:
    """A merge patch, conditional on the object's resourceVersion (a change in between is a 409: retried, and
    the retry reads the object again); the object as patched."""
    md = obj.get("metadata") or {}
    patch = merge_patch([*values, (["metadata", "resourceVersion"], md.get("resourceVersion"))])
    client = ctx.services.kube()
    with kube_errors(f"patch {k.kind} {md.get('namespace')}/{md.get('name')}"):
        got = await client.patch(resource_for(k.api_version, k.kind), md["name"], patch,
                                 namespace=md.get("namespace"), patch_type=PatchType.MERGE)
    out: dict[str, Any] = got.to_dict()
    return out


Step = tuple[Kind, dict[str, Any], list[Change]]
"""One object and the changes to make on it (each from `before` to `after`)."""


async def _all_or_nothing(ctx: ActionContext, steps: list[Step]) -> None:
    """Make every step's changes, in order; when one fails, set back those already made (newest first) and
    raise its error, saying what was set back or could not be: never leave a workload half paused."""
    done: list[tuple[Kind, dict[str, Any], list[Change]]] = []
    for k, obj, changes in steps:
        try:
            patched = await _patch(ctx, k, obj, [(c.path, c.after) for c in changes])
        except (PermanentError, TransientError) as e:
            back = await _roll_back(ctx, done)
            raise type(e)(f"{e}; {back}" if back else str(e)) from None
        done.append((k, patched, changes))


async def _roll_back(ctx: ActionContext, done: list[tuple[Kind, dict[str, Any], list[Change]]]) -> str:
    said: list[str] = []
    for k, patched, changes in reversed(done):
        name = f"{k.kind} {patched['metadata'].get('name')}"
        try:
            await _patch(ctx, k, patched, [(c.path, c.before) for c in changes])
            said.append(f"{name} set back")
        except (PermanentError, TransientError) as e:
            said.append(f"{name} could NOT be set back ({e})")
    return "nothing else changed" if not done else "rolled back: " + ", ".join(said)


def _labels_refusal(obj: Mapping[str, Any], ctx: ActionContext) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, value in ctx.config.protect.workload_labels.items():
        if labels.get(key) == value:
            return f"workload label {key}={value} is protected (protect.workload_labels)"
    return None


async def _nearest_pausable(ctx: ActionContext, namespace: str, top: str, pods: list[str]) -> tuple[
        Kind, dict[str, Any]] | str:
    """The owner nearest the top that can be paused, walking up from one of the job's pods; or why none."""
    if not pods:
        return f"{top} cannot be paused, and the job names no pod to find an owner below it that can"
    obj = await _read(ctx, KINDS["Pod"], namespace, pods[0])
    if obj is None:
        return f"{top} cannot be paused, and its pod {namespace}/{pods[0]} is gone"
    best: tuple[Kind, dict[str, Any]] | None = None
    for _ in range(8):
        refs = (obj.get("metadata") or {}).get("ownerReferences") or []
        ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
        if ref is None:
            break
        k = kind_of(ref["apiVersion"], ref["kind"])
        if k.pause is None and k.kind not in KINDS:
            break  # above an unknown kind nothing can be read by name with certainty
        got = await _read(ctx, k, namespace, ref["name"])
        if got is None:
            break
        obj = got
        if k.pause is not None:
            best = (k, got)
    if best is None:
        return f"{top} cannot be paused (pause knows no way to stop its kind) and none of its pods' owners can"
    return best


async def _pause(ctx: ActionContext, p: PauseParams) -> ActionResult:
    job, facts = job_of(p.job, ctx.request.facts)
    parts = split_job_id(job) if job else None
    if parts is None or job is None:
        return ActionResult(status="refused", detail=f"{job!r} is not a Kubernetes job (<namespace>/<Kind>/<name>)")
    namespace, kind, name = parts
    if namespace in ctx.config.protect.namespaces:
        return ActionResult(status="refused", detail=f"namespace {namespace} is protected (protect.namespaces)")
    if kind == "Pod":
        return ActionResult(status="refused", detail=f"{job} is a pod with no controller: nothing would keep it "
                            "stopped or start it again (cancel deletes it)")
    known = KINDS.get(kind)
    target: tuple[Kind, dict[str, Any]] | str
    note = ""
    if known is not None and known.pause is not None:
        obj = await _read(ctx, known, namespace, name)
        if obj is None:
            return ActionResult(status="refused", detail=f"{kind} {namespace}/{name} does not exist (any more)")
        md = obj.get("metadata") or {}
        if facts.controller_uid and md.get("uid") != facts.controller_uid:
            return ActionResult(status="refused", detail=f"{kind} {namespace}/{name} is not the one decided on "
                                f"(uid {md.get('uid')}, decided on {facts.controller_uid}): created again since")
        gen = md.get("generation")
        if facts.controller_generation is not None and gen != facts.controller_generation:
            return ActionResult(status="refused", detail=f"{kind} {namespace}/{name} changed since the decision "
                                f"(generation {facts.controller_generation} -> {gen})")
        target = (known, obj)
    else:
        target = await _nearest_pausable(ctx, namespace, f"{kind} {namespace}/{name}", facts.pods or [])
        if isinstance(target, str):
            return ActionResult(status="refused", detail=target)
        tk, tobj = target
        note = (f"; {kind} {name} cannot be paused, so its {tk.kind} {tobj['metadata']['name']} was (its "
                f"controller may undo this)")
    k, obj = target
    why = _labels_refusal(obj, ctx)
    if why is not None:
        return ActionResult(status="refused", detail=f"{k.kind} {namespace}/{obj['metadata']['name']}: {why}")
    return await _apply_pause(ctx, p, job, k, obj, note)


async def _apply_pause(ctx: ActionContext, p: PauseParams, job: str, k: Kind, obj: dict[str, Any],
                       note: str) -> ActionResult:
    svc = ctx.services
    now = svc.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    md = obj["metadata"]
    what = f"{k.kind} {md.get('namespace')}/{md['name']}"
    targets: list[tuple[Kind, dict[str, Any]]] = [(k, obj)]
    if k.kind == "CronJob":  # suspending it stops new runs; the runs under way are Jobs, suspended too
        for ref in (obj.get("status") or {}).get("active") or []:
            child = await _read(ctx, KINDS["Job"], md.get("namespace", ""), ref["name"])
            if child is not None:
                targets.append((KINDS["Job"], child))
    record = PauseRecord(job=job, rule=ctx.request.rule, at=now, objects=[])
    for tk, tobj in targets:
        changes = pause_changes(tk, tobj, now)
        if changes:
            tmd = tobj["metadata"]
            changes.append(Change(path=["metadata", "annotations", PAUSED_BY],
                                  before=(tmd.get("annotations") or {}).get(PAUSED_BY),
                                  after=f"{ctx.request.rule} {now}"))
            record.objects.append(Paused(api_version=tk.api_version, kind=tk.kind, namespace=tmd.get("namespace"),
                                         name=tmd["name"], uid=tmd.get("uid", ""), changes=changes))
    if not record.objects:
        return ActionResult(detail=f"{what} is paused already{note}", data={"job": job})
    key = record_key(job)
    old = await svc.kv.get(key)
    if old is not None:  # paused before and started again since: what is changed now is what resume undoes
        prior = PauseRecord.model_validate_json(old.value)
        record.objects += [o for o in prior.objects if (o.kind, o.name) not in {(x.kind, x.name)
                                                                                for x in record.objects}]
    await svc.kv.put(key, record.model_dump_json().encode())
    objs = {(tk.kind, tobj["metadata"]["name"]): (tk, tobj) for tk, tobj in targets}
    first = objs.get((record.objects[0].kind, record.objects[0].name))
    written = with_annotation(record, (first[1]["metadata"].get("annotations") or {}).get(PAUSED) if first else None)
    steps: list[Step] = []
    for o in written.objects:
        found = objs.get((o.kind, o.name))
        if found is not None and o.uid == found[1]["metadata"].get("uid", ""):
            steps.append((found[0], found[1], o.changes))
    try:
        await _all_or_nothing(ctx, steps)
    except (PermanentError, TransientError):
        await (svc.kv.put(key, old.value) if old is not None else svc.kv.delete(key))
        raise
    client = svc.kube()
    said: list[str] = []
    for _tk, tobj, changes in steps:
        msg = f"paused by gpuevents rule {ctx.request.rule}: {describe(changes)}"
        if p.reason:
            msg += f" ({p.reason})"
        problem = await post_event(client, tobj, "GpueventsPaused", msg, warning=True, now=svc.clock.now())
        if problem:
            said.append(problem)
    changed = "; ".join(f"{o.kind} {o.name}: {describe(o.changes)}" for o in record.objects)
    return ActionResult(detail=f"paused {what} ({changed}){note}" + (f"; {said[0]}" if said else ""),
                        data={"job": job, "paused": [o.model_dump() for o in record.objects]})


async def _recorded(ctx: ActionContext, job: str) -> tuple[PauseRecord | None, str]:
    """What pause changed on `job`: from the engine's store, else from the annotation on the workload (the
    store is gone: a new KV bucket, another engine); and where it was found."""
    got = await ctx.services.kv.get(record_key(job))
    if got is not None:
        return PauseRecord.model_validate_json(got.value), "store"
    parts = split_job_id(job)
    known = KINDS.get(parts[1]) if parts else None
    if parts is None or known is None or known.pause is None:
        return None, ""
    obj = await _read(ctx, known, parts[0], parts[2])
    return (record_on(obj) if obj is not None else None), "annotation"


async def _resume(ctx: ActionContext, p: ResumeParams) -> ActionResult:
    job, _ = job_of(p.job, ctx.request.facts)
    if not job or split_job_id(job) is None:
        return ActionResult(status="refused", detail=f"{job!r} is not a Kubernetes job (<namespace>/<Kind>/<name>)")
    svc = ctx.services
    record, where = await _recorded(ctx, job)
    if record is None:
        return ActionResult(detail=f"nothing to resume: gpuevents has not paused {job} (no record in its store, "
                            f"no {PAUSED} annotation on it)", data={"job": job})
    notes: list[str] = []
    steps: list[Step] = []
    for o in record.objects:
        k = kind_of(o.api_version, o.kind)
        obj = await _read(ctx, k, o.namespace, o.name)
        if obj is None:
            notes.append(f"{o.kind} {o.name} is gone")
            continue
        if obj["metadata"].get("uid") != o.uid:
            notes.append(f"{o.kind} {o.name} was created again since the pause: not touched")
            continue
        undo, left = resume_changes(o.changes, obj)
        notes += [f"{o.kind} {o.name}: {why}" for why in left]
        if undo:
            steps.append((k, obj, [Change(path=c.path, before=c.before, after=c.after) for c in undo]))
    await _all_or_nothing(ctx, steps)
    restored = [f"{k.kind} {obj['metadata']['name']}: {describe(changes)}" for k, obj, changes in steps]
    for _k, obj, changes in steps:
        problem = await post_event(svc.kube(), obj, "GpueventsResumed",
                                   f"resumed by gpuevents rule {ctx.request.rule}: {describe(changes)}",
                                   now=svc.clock.now())
        if problem:
            notes.append(problem)
    await svc.kv.delete(record_key(job))
    detail = f"resumed {job}" + (f" ({'; '.join(restored)})" if restored else ": nothing to set back")
    if where == "annotation":
        detail += f" (from the {PAUSED} annotation: the engine's store had no record)"
    return ActionResult(detail=detail + (f"; {'; '.join(notes)}" if notes else ""),
                        data={"job": job, "restored": restored, "notes": notes})


class PauseAction(PauseSpec):
    async def run(self, params: PauseParams, ctx: ActionContext) -> ActionResult:
        return await _pause(ctx, params)


class ResumeAction(ResumeSpec):
    async def run(self, params: ResumeParams, ctx: ActionContext) -> ActionResult:
        return await _resume(ctx, params)
