"""Validation of a job's graph and checkpoint config, and the subtasks they imply."""

from __future__ import annotations

from app.domain.policies import POLICY_RULES
from app.errors import Invalid
from contract.models import NAME_RE, CheckpointConfig, Graph, Partitioning


def validate_graph(graph: Graph) -> None:
    """Refuse a graph that cannot run, naming the problem."""
    ids: dict[str, int] = {}
    for v in graph.vertices:
        if not NAME_RE.match(v.id):
            raise Invalid(f"vertex id {v.id!r} must be 1-128 characters of letters, digits, '_', '.', '-'")
        if v.id in ids:
            raise Invalid(f"vertex id {v.id!r} appears twice; vertex ids must be unique")
        if v.parallelism < 1:
            raise Invalid(f"vertex {v.id!r} has parallelism {v.parallelism}; it must be at least 1")
        if v.max_parallelism < v.parallelism:
            raise Invalid(
                f"vertex {v.id!r} has max_parallelism {v.max_parallelism} below its parallelism "
                f"{v.parallelism}; max_parallelism must be at least the parallelism"
            )
        if v.max_parallelism > 32768:
            raise Invalid(f"vertex {v.id!r} has max_parallelism {v.max_parallelism}; the limit is 32768")
        ids[v.id] = v.parallelism
    seen_edges: set[tuple[str, str]] = set()
    for e in graph.edges:
        for end in (e.source, e.target):
            if end not in ids:
                raise Invalid(f"edge {e.source!r} -> {e.target!r} refers to unknown vertex {end!r}")
        if e.source == e.target:
            raise Invalid(f"edge {e.source!r} -> {e.target!r} is a self-loop; the graph must be acyclic")
        if (e.source, e.target) in seen_edges:
            raise Invalid(f"edge {e.source!r} -> {e.target!r} appears twice")
        seen_edges.add((e.source, e.target))
        if e.partitioning == Partitioning.forward and ids[e.source] != ids[e.target]:
            raise Invalid(
                f"forward edge {e.source!r} -> {e.target!r} connects parallelism {ids[e.source]} to "
                f"{ids[e.target]}; forward needs equal parallelism (use rebalance or hash)"
            )
    cycle = _find_cycle(list(ids), [(e.source, e.target) for e in graph.edges])
    if cycle:
        raise Invalid(f"the graph has a cycle: {' -> '.join(cycle)}; pipelines must be acyclic")
    total = sum(ids.values())
    if total > 100_000:
        raise Invalid(f"the graph has {total} subtasks; the limit is 100000")


def _find_cycle(nodes: list[str], edges: list[tuple[str, str]]) -> list[str] | None:
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        out[a].append(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in out[n]:
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in nodes:
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def validate_config(cfg: CheckpointConfig) -> None:
    """Refuse a checkpoint config with impossible values, naming the field."""
    if cfg.interval is not None and cfg.interval <= 0:
        raise Invalid(f"checkpoint.interval must be positive (ms) or null, got {cfg.interval}")
    if cfg.timeout <= 0:
        raise Invalid(f"checkpoint.timeout must be positive (ms), got {cfg.timeout}")
    if cfg.min_pause < 0:
        raise Invalid(f"checkpoint.min_pause must not be negative (ms), got {cfg.min_pause}")
    if cfg.max_concurrent < 1:
        raise Invalid(f"checkpoint.max_concurrent must be at least 1, got {cfg.max_concurrent}")
    if cfg.tolerable_failures < 0:
        raise Invalid(f"checkpoint.tolerable_failures must not be negative, got {cfg.tolerable_failures}")
    if cfg.retained < 1:
        raise Invalid(f"checkpoint.retained must be at least 1, got {cfg.retained}")
    if cfg.alignment_timeout is not None:
        if cfg.alignment_timeout < 0:
            raise Invalid(
                f"checkpoint.alignment_timeout must not be negative (ms), got {cfg.alignment_timeout}"
            )
        if not POLICY_RULES[cfg.policy].takes_alignment_timeout:
            takes = [p.value for p, rule in POLICY_RULES.items() if rule.takes_alignment_timeout]
            raise Invalid(
                f"checkpoint.alignment_timeout applies only to policy {', '.join(takes)}, not {cfg.policy.value}"
            )
        if cfg.alignment_timeout >= cfg.timeout:
            raise Invalid(
                f"checkpoint.alignment_timeout {cfg.alignment_timeout} ms must be below checkpoint.timeout "
                f"{cfg.timeout} ms, or alignment would never switch before the checkpoint expires"
            )
    budgets = {"max_inflight_bytes_per_subtask": cfg.max_inflight_bytes_per_subtask,
               "max_inflight_bytes": cfg.max_inflight_bytes}
    for name, budget in budgets.items():
        if budget is None:
            continue
        if budget < 0:
            raise Invalid(f"checkpoint.{name} must not be negative (bytes), got {budget}")
        rule = POLICY_RULES[cfg.policy]
        if not rule.takes_inflight_budget:
            raise Invalid(
                f"checkpoint.{name} limits the in-flight data unaligned checkpoints persist; policy "
                f"{cfg.policy.value} {rule.no_inflight_budget}: remove it or choose another policy"
            )


def subtasks_of(graph: Graph) -> dict[str, int]:
    """vertex id -> parallelism."""
    return {v.id: v.parallelism for v in graph.vertices}
