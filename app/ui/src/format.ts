// Formatting of durations, sizes and times for tables and charts.
export function ms(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  if (v < 1000) return `${Math.round(v)} ms`;
  if (v < 60_000) return `${(v / 1000).toFixed(v < 10_000 ? 2 : 1)} s`;
  return `${Math.floor(v / 60_000)} min ${Math.round((v % 60_000) / 1000)} s`;
}

export function bytes(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let x = v;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  // bytes are whole (an average of sizes is not): "346 B", never "346.5 B"
  return i === 0 ? `${Math.round(x)} B` : `${x.toFixed(x < 10 ? 1 : 0)} ${units[i]}`;
}

export function time(ts: number | null | undefined): string {
  if (!ts) return "–";
  const d = new Date(ts);
  const today = new Date().toDateString() === d.toDateString();
  const t = d.toLocaleTimeString(undefined, { hour12: false });
  return today ? t : `${d.toLocaleDateString()} ${t}`;
}

export function age(ts: number | null | undefined, now: number = Date.now()): string {
  if (!ts) return "–";
  const s = Math.max(0, Math.round((now - ts) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86_400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86_400)} d ago`;
}

export function count(n: number): string {
  return n.toLocaleString("en-US");
}

export function percent(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  return `${Math.round(v * 100)}%`;
}

export function rate(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  if (v >= 10_000) return `${(v / 1000).toFixed(v >= 100_000 ? 0 : 1)}k/s`;
  return `${Math.round(v).toLocaleString("en-US")}/s`;
}

/** Nearest-rank percentile of values (sorted ascending), as the coordinator computes it. */
export function percentile(sorted: number[], p: number): number | null {
  if (sorted.length === 0) return null;
  return sorted[Math.max(0, Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1))];
}

/** An event time (a watermark): the time with milliseconds, and the date when it is not today. */
export function eventTime(ts: number | null | undefined): string {
  if (ts === null || ts === undefined) return "–";
  const d = new Date(ts);
  const t = d.toLocaleTimeString("en-GB", { hour12: false });
  if (new Date().toDateString() === d.toDateString()) return `${t}.${String(d.getMilliseconds()).padStart(3, "0")}`;
  const pad = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${t}`;
}

/** A duration that may be long (a watermark's lag): ms, s with a decimal, then min, h and d; negative: ahead. */
export function duration(v: number | null | undefined): string {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  const sign = v < 0 ? "-" : "";
  if (a < 1000) return `${sign}${Math.round(a)} ms`;
  if (a < 60_000) return `${sign}${(a / 1000).toFixed(1)} s`;
  if (a < 3_600_000) return `${sign}${Math.floor(a / 60_000)} min ${Math.floor((a % 60_000) / 1000)} s`;
  if (a < 86_400_000) return `${sign}${Math.floor(a / 3_600_000)} h ${Math.floor((a % 3_600_000) / 60_000)} min`;
  return `${sign}${count(Math.floor(a / 86_400_000))} d`;
}
