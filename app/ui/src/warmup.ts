// Warm-up checkpoints: each attempt's checkpoints up to its first completed one waited for the Spark tasks to start,
// which says nothing about barriers; they are shown but set neither the chart's scale nor the percentile tile.
import type { Checkpoint } from "./api/client";

/** Ids of the warm-up checkpoints among `checkpoints` (any order). `complete`: the list reaches back to the job's
 * first checkpoint; when it does not, the oldest attempt in it may have started before it and is not judged. */
export function warmUp(checkpoints: Checkpoint[], complete: boolean): Set<number> {
  const ordered = [...checkpoints].sort((a, b) => a.id - b.id);
  const cut = complete || ordered.length === 0 ? null : ordered[0].attempt;
  const out = new Set<number>();
  const done = new Set<number>();
  for (const c of ordered) {
    if (c.attempt === cut || done.has(c.attempt) || c.is_savepoint) continue;
    out.add(c.id);
    if (c.status === "COMPLETED") done.add(c.attempt);
  }
  return out;
}

/** The largest value of the steady completed checkpoints (neither warm-up nor savepoints: a savepoint is aligned
 * whatever the policy, and a user's, so it says nothing about the job's checkpoints), or of all when there are none. */
export function steadyMax(checkpoints: Checkpoint[], warm: Set<number>, value: (c: Checkpoint) => number): number {
  const done = checkpoints.filter((c) => c.status === "COMPLETED");
  const steady = done.filter((c) => !warm.has(c.id) && !c.is_savepoint);
  return Math.max(1, ...(steady.length ? steady : done).map(value));
}
