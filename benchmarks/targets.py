"""The FLIP-76 test plan's targets, each as met, missed or not determined by a run, and by how much."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.results import DISK_BAR, BenchResults, ms, ratio


@dataclass
class Target:
    name: str
    measured: str
    status: str  # "met", "missed", "not determined"
    detail: str

    def row(self) -> str:
        mark = {"met": "✅ met", "missed": "❌ missed", "not determined": "❔ not determined"}[self.status]
        return f"| {self.name} | {self.measured} | {mark} | {self.detail} |"


def targets(r: BenchResults) -> list[Target]:
    out: list[Target] = []
    for d in r.settings.depths:
        al, un = r.run_of("aligned", d), r.run_of("unaligned", d)
        if un is None or un.p50 is None:
            if un is not None:
                out.append(Target(f"depth {d}: unaligned p50 < 100 ms", "–", "not determined",
                                  "no completed unaligned checkpoint after warm-up"))
            continue
        a, bound = al.p50_or_bound if al is not None else (None, False)
        if al is None:
            pass  # aligned was not run: no ratio
        elif a is None:
            out.append(Target(f"depth {d}: unaligned p50 ≤ aligned p50 / 20", f"unaligned {ms(un.p50)}",
                              "not determined", "aligned: no checkpoint after warm-up"))
        else:
            rr = a / un.p50 if un.p50 else float("inf")
            measured = f"aligned {ms(a, bound)} / unaligned {ms(un.p50)} = {ratio(a, un.p50, bound)}"
            if rr >= 20:
                out.append(Target(f"depth {d}: unaligned p50 ≤ aligned p50 / 20", measured, "met",
                                  f"{rr / 20:.1f}× better than the target"))
            elif bound:
                out.append(Target(f"depth {d}: unaligned p50 ≤ aligned p50 / 20", measured, "not determined",
                                  "no aligned checkpoint completed after warm-up; the ratio is a lower bound "
                                  "below 20 — run longer"))
            else:
                out.append(Target(f"depth {d}: unaligned p50 ≤ aligned p50 / 20", measured, "missed",
                                  f"ratio {rr:.1f}× instead of ≥ 20×: unaligned p50 is {20 / rr:.1f}× too high "
                                  f"(needs ≤ {ms(a / 20)})"))
        if un.p50 < 100:
            out.append(Target(f"depth {d}: unaligned p50 < 100 ms", ms(un.p50), "met",
                              f"{100 / max(un.p50, 1):.1f}× under"))
        else:
            out.append(Target(f"depth {d}: unaligned p50 < 100 ms", ms(un.p50), "missed",
                              f"{un.p50 / 100:.1f}× the target ({un.p50 - 100:,.0f} ms over)"))
    u1, u3 = r.run_of("unaligned", 1), r.run_of("unaligned", 3)
    if u1 and u3 and u1.p50 and u3.p50:
        rr = u3.p50 / u1.p50
        detail = f"{1.5 / rr:.2f}× margin" if rr <= 1.5 else f"{rr / 1.5:.2f}× over the 1.5× bound"
        out.append(Target("unaligned p50 at depth 3 ≤ 1.5 × depth 1", f"{ms(u3.p50)} / {ms(u1.p50)} = {rr:.2f}×",
                          "met" if rr <= 1.5 else "missed", detail))
    none = [x for x in r.free if x.policy is None]
    unal = [x for x in r.free if x.policy == "unaligned"]
    if none and unal:
        import statistics

        a = statistics.median(x.throughput for x in none)
        b = statistics.median(x.throughput for x in unal)
        cost = (a - b) / a if a else 0.0
        measured = f"{b:,.0f} vs {a:,.0f} records/s: {cost * 100:+.1f}% cost"
        out.append(Target("unaligned every second costs ≤ 5% throughput without backpressure", measured,
                          "met" if cost <= 0.05 else "missed",
                          "within the target" if cost <= 0.05 else f"{(cost - 0.05) * 100:.1f} points over"))
    if r.disk and r.disk.raw:
        rr = r.disk.ratio
        out.append(Target(f"channel-state writes ≥ {DISK_BAR:.0%} of raw disk bandwidth",
                          f"{r.disk.channel_state:,.0f} / {r.disk.raw:,.0f} MiB/s = {rr * 100:.0f}%",
                          "met" if rr >= DISK_BAR else "missed",
                          f"{rr / DISK_BAR:.2f}× the bar" if rr >= DISK_BAR
                          else f"{(DISK_BAR - rr) * 100:.0f} points short"))
    return out
