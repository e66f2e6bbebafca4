"""How two job graphs relate: a new run of a job may change the parallelism of its vertices, and nothing else."""

from __future__ import annotations

from contract.models import Graph


class IncompatibleGraph(ValueError):
    """The graphs differ in more than parallelism; the message names the vertex or edge and what differs."""


def rescaling(job: Graph, pipeline: Graph, job_id: int | None = None) -> dict[str, int]:
    """The parallelism changes that turn the job's graph into the pipeline's (vertex id -> new parallelism).

    Raises :class:`IncompatibleGraph` when they differ otherwise: other vertices, another kind, keyed-ness or
    ``max_parallelism`` of a vertex (key groups cannot be redistributed across a different number of them), other
    edges or another partitioning of an edge.
    """
    name = f"job {job_id}" if job_id is not None else "the job"
    fix = "a job's operators and edges are fixed: run this pipeline as a new job, or change only parallelism"
    old = {v.id: v for v in job.vertices}
    new = {v.id: v for v in pipeline.vertices}
    if set(old) != set(new):
        gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        parts = [f"{name} has vertices {gone} that the pipeline lacks"] if gone else []
        parts += [f"the pipeline has vertices {added} that {name} lacks"] if added else []
        raise IncompatibleGraph("; ".join(parts) + f"; {fix}")
    for vid, o in old.items():
        n = new[vid]
        for field in ("kind", "keyed", "max_parallelism"):
            if getattr(o, field) != getattr(n, field):
                raise IncompatibleGraph(
                    f"vertex {vid!r}: {field} is {getattr(n, field)!r} in the pipeline but {getattr(o, field)!r} in "
                    f"{name}; {fix}"
                )
    old_edges = {(e.source, e.target): e.partitioning for e in job.edges}
    new_edges = {(e.source, e.target): e.partitioning for e in pipeline.edges}
    for key in sorted(set(old_edges) | set(new_edges)):
        if old_edges.get(key) != new_edges.get(key):
            def shown(p):
                return "no edge" if p is None else f"a {p.value} edge"

            raise IncompatibleGraph(
                f"edge {key[0]!r} -> {key[1]!r} is {shown(new_edges.get(key))} in the pipeline but "
                f"{shown(old_edges.get(key))} in {name}; {fix}"
            )
    return {vid: new[vid].parallelism for vid in old if new[vid].parallelism != old[vid].parallelism}
