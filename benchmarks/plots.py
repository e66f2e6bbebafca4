"""The main report's PNG plots: checkpoint duration per policy and depth, and throughput with and without
backpressure."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import BenchResults, ms


def plots(r: BenchResults, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    colors = {"aligned": "#d62728", "unaligned": "#2ca02c", "aligned_then_unaligned": "#1f77b4"}
    if r.backpressure:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        depths = list(r.settings.depths)
        width = 0.8 / max(1, len(r.settings.policies))
        for i, pol in enumerate(r.settings.policies):
            for j, d in enumerate(depths):
                x = r.run_of(pol, d)
                if x is None:
                    continue
                p50, bound = x.p50_or_bound
                if p50 is None:
                    continue
                pos = j + (i - (len(r.settings.policies) - 1) / 2) * width
                ax.bar(pos, p50, width, color=colors.get(pol, "grey"), hatch="//" if bound else None,
                       alpha=0.5 if bound else 0.9, label=pol if j == 0 else None, edgecolor="black", lw=0.4)
                if x.p90 is not None and not bound:
                    ax.plot([pos, pos], [p50, x.p90], color="black", lw=1)
                    ax.plot([pos - width / 4, pos + width / 4], [x.p90, x.p90], color="black", lw=1)
                ax.annotate(ms(p50, bound), (pos, p50), ha="center", va="bottom", fontsize=7)
        ax.axhline(100, color="grey", ls="--", lw=0.8)
        ax.text(-0.45, 100, "100 ms", va="bottom", ha="left", fontsize=7, color="grey")
        for k, a in enumerate(r.ack_path):
            depth = a.subtasks // r.settings.parallelism - 1
            if depth in depths and a.direct_p50:
                j = depths.index(depth)
                ax.plot([j - 0.42, j + 0.42], [a.direct_p50, a.direct_p50], color="black", ls=":", lw=1.2,
                        label="ack path alone (no pipeline)" if k == 0 else None)
        ax.set_yscale("log")
        ax.set_xticks(range(len(depths)), [f"depth {d}" for d in depths])
        ax.set_ylabel("end-to-end checkpoint duration, p50 (ms, log)")
        ax.set_title(f"Checkpoints under backpressure ({r.settings.record_cost_ms:g} ms/record, "
                     f"parallelism {r.settings.parallelism}); whisker: p90, hatched: lower bound", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "checkpoint_duration.png", dpi=120)
        plt.close(fig)
        made.append("checkpoint_duration.png")
    if r.backpressure or r.free:
        import statistics

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        base = r.no_checkpoints_backpressure
        bp = [x for x in r.backpressure if x.depth == min(r.settings.depths)]
        names = (["none"] if base else []) + [x.policy or "" for x in bp]
        vals = ([base.throughput] if base else []) + [x.throughput for x in bp]
        axes[0].bar(range(len(vals)), vals, color=["grey"] + [colors.get(n, "grey") for n in names[1:]])
        axes[0].set_xticks(range(len(vals)), [n.replace("aligned_then_unaligned", "a→u") for n in names],
                           fontsize=8)
        axes[0].set_title("under backpressure (records/s)", fontsize=9)
        groups: dict[str, list[float]] = {}
        for x in r.free:
            groups.setdefault(x.policy or "none", []).append(x.throughput)
        names2 = list(groups)
        vals2 = [statistics.median(v) for v in groups.values()]
        axes[1].bar(range(len(vals2)), vals2, color=[colors.get(n, "grey") for n in names2])
        axes[1].set_xticks(range(len(vals2)), names2, fontsize=8)
        axes[1].set_title("without backpressure (records/s, median)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=120)
        plt.close(fig)
        made.append("throughput.png")
    return made
