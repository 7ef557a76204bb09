#!/usr/bin/python3
"""The report half of bench/scale.sh (which runs the commands and writes the
records): one markdown table on stdout, optionally the same rows as JSON and
a PNG of wall time and peak RSS against positions.

    bench/scale_report.py --records RECORDS.tsv --extra EXTRA.tsv
        --threads-all N --runs N [--meta KEY=VALUE ...] [--json FILE]
        [--png FILE]

RECORDS: one line per timed command, tab-separated: shape layers heads dim
positions command threads pair wall user sys peak_rss_kib bytes. EXTRA:
shape positions key value (bench_anchor's RESULT fields, archive and
codebook bytes, "skipped" with the reason).

Per (shape, positions, command, threads): the median wall and CPU (user +
system) over the pairs, the largest peak RSS, GB/s of fp16 (bytes / median
wall), positions per CPU second, and for a command with an anchor the
median (and min) of the per-pair ratios command / anchor (pairs matched by
index, same threads). Targets: TARGETS below.
"""
import argparse
import json
import statistics
import sys

ANCHOR = {"pack": "zstd -3 -T0", "unpack": "cp + sync", "restore": "pread (dd)"}
ORDER = ["train", "pack", "zstd -3 -T0", "unpack", "cp + sync", "verify", "restore",
         "pread (dd)", "read"]
SHAPES = ["gpt2", "llama8b", "llama70b"]
# what each command's wall covers, for the table's notes
TARGETS = {
    "unpack_vs_cp_sync": 1.5,     # fkvf unpack wall / cp + sync wall, every shape: <=
    "pack_pos_per_s_core": 700,   # at the Llama-3-8B shape (32 x 8 x 128): >=
    "speedup": 1.8,               # all threads (2) vs 1, CPU-bound commands: >=
}
CPU_BOUND = ("train", "pack")


def load(a):
    recs, extra = [], {}
    with open(a.records) as f:
        for line in f:
            v = line.rstrip("\n").split("\t")
            if len(v) != 13:
                continue
            recs.append(dict(shape=v[0], layers=int(v[1]), heads=int(v[2]), dim=int(v[3]),
                             positions=int(v[4]), command=v[5], threads=int(v[6]),
                             pair=int(v[7]), wall=float(v[8]), cpu=float(v[9]) + float(v[10]),
                             rss_kib=int(v[11]), bytes=int(v[12])))
    with open(a.extra) as f:
        for line in f:
            v = line.rstrip("\n").split("\t")
            if len(v) == 4:
                extra.setdefault((v[0], int(v[1])), {})[v[2]] = v[3]
    return recs, extra


def rows_of(recs, extra, tall):
    groups = {}
    for r in recs:
        groups.setdefault((r["shape"], r["positions"], r["command"], r["threads"]), []).append(r)
    rows = []
    for (s, p, c, th), rs in groups.items():
        walls = [r["wall"] for r in rs]
        cpus = [r["cpu"] for r in rs]
        w, cpu = statistics.median(walls), statistics.median(cpus)
        row = dict(shape=s, layers=rs[0]["layers"], heads=rs[0]["heads"], dim=rs[0]["dim"],
                   positions=p, command=c, threads=th, runs=len(rs), wall_s=w, cpu_s=cpu,
                   walls=walls, cpus=cpus, peak_rss_mib=max(r["rss_kib"] for r in rs) / 1024,
                   bytes=rs[0]["bytes"], gbps=rs[0]["bytes"] / w / 1e9 if w > 0 else None,
                   pos_per_cpu_s=None, anchor=None, ratio=None, ratio_min=None, cpu_ratio=None,
                   inproc_ratio=None, inproc_cpu_ratio=None, speedup=None, target=None)
        if c in ("train", "pack", "unpack", "verify", "restore") and cpu > 0:
            row["pos_per_cpu_s"] = p / cpu
        an = ANCHOR.get(c)
        if an and (s, p, an, th) in groups:
            apair = {r["pair"]: r for r in groups[(s, p, an, th)]}
            wr = [r["wall"] / max(apair[r["pair"]]["wall"], 1e-6) for r in rs if r["pair"] in apair]
            cr = [r["cpu"] / max(apair[r["pair"]]["cpu"], 1e-3) for r in rs if r["pair"] in apair]
            if wr:
                row.update(anchor=an, ratio=statistics.median(wr), ratio_min=min(wr),
                           cpu_ratio=statistics.median(cr))
        ex = extra.get((s, p), {})
        if c == "restore" and "restore_vs_pread_wall" in ex:
            row["inproc_ratio"] = float(ex["restore_vs_pread_wall"])
            row["inproc_cpu_ratio"] = float(ex.get("restore_vs_pread", "nan"))
        if c == "read" and "random_vs_pread_wall" in ex:
            row["inproc_ratio"] = float(ex["random_vs_pread_wall"])
            row["inproc_cpu_ratio"] = float(ex.get("random_vs_pread", "nan"))
        rows.append(row)
    by = {(r["shape"], r["positions"], r["command"], r["threads"]): r for r in rows}
    for r in rows:
        one = by.get((r["shape"], r["positions"], r["command"], 1))
        if r["threads"] != 1 and one and r["wall_s"] > 0 and r["command"] not in ANCHOR.values():
            r["speedup"] = one["wall_s"] / r["wall_s"]
        # targets
        if r["command"] == "unpack" and r["ratio"] is not None:
            r["target"] = ("<= %.1fx cp+sync" % TARGETS["unpack_vs_cp_sync"],
                           r["ratio"] <= TARGETS["unpack_vs_cp_sync"])
        elif r["command"] == "pack" and r["threads"] == 1 and r["shape"] == "llama8b" \
                and r["pos_per_cpu_s"] is not None:
            r["target"] = (">= %d pos/s/core" % TARGETS["pack_pos_per_s_core"],
                           r["pos_per_cpu_s"] >= TARGETS["pack_pos_per_s_core"])
        elif r["command"] in CPU_BOUND and r["speedup"] is not None and tall >= 2:
            r["target"] = ("speedup >= %.1fx" % TARGETS["speedup"],
                           r["speedup"] >= TARGETS["speedup"])
    shapes = SHAPES + sorted({r["shape"] for r in rows} - set(SHAPES))
    rows.sort(key=lambda r: (shapes.index(r["shape"]), r["command"] != "train", r["positions"],
                             ORDER.index(r["command"]) if r["command"] in ORDER else 99,
                             r["threads"]))
    return rows


def fmt(x, f="%.3g"):
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x) >= 1000:
        return "{:,.0f}".format(x)
    return f % x


def table(rows, extra, meta):
    out = []
    out.append("| shape | positions | command | threads | wall s | CPU s | peak RSS MiB | "
               "GB/s fp16 | pos/s/core | vs anchor (wall: median [min]) | "
               "in-process vs pread (wall) | speedup vs 1 thread | target |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    skipped = {k: v["skipped"] for k, v in extra.items() if "skipped" in v}
    done = set()
    for r in rows:
        key = (r["shape"], r["positions"])
        shape = "%s (%dx%dx%d)" % (r["shape"], r["layers"], r["heads"], r["dim"])
        wall = fmt(r["wall_s"] * 1e6, "%.1f") + " us" if r["command"] == "read" else fmt(r["wall_s"])
        ratio = "-"
        if r["ratio"] is not None:
            ratio = "%.2f [%.2f] vs %s" % (r["ratio"], r["ratio_min"], r["anchor"])
        tgt = "-"
        if r["target"]:
            tgt = "%s: %s" % (r["target"][0], "met" if r["target"][1] else "NOT met")
        out.append("| %s | %s | %s | %s | %s | %s | %.1f | %s | %s | %s | %s | %s | %s |" % (
            shape, "{:,}".format(r["positions"]), r["command"], r["threads"], wall,
            "-" if r["command"] == "read" else fmt(r["cpu_s"]), r["peak_rss_mib"], fmt(r["gbps"]), fmt(r["pos_per_cpu_s"], "%.0f"),
            ratio, fmt(r["inproc_ratio"], "%.2f"), fmt(r["speedup"], "%.2fx"), tgt))
        done.add(key)
    for (s, p), why in sorted(skipped.items()):
        out.append("| %s | %s | - | - | skipped (%s) | | | | | | | | |" % (s, "{:,}".format(p), why))
    sizes = []
    order = SHAPES + sorted({s for s, _ in extra} - set(SHAPES))
    for (s, p), ex in sorted(extra.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1])):
        if "archive_bytes" in ex:
            raw = next((r["bytes"] for r in rows if r["shape"] == s and r["positions"] == p
                        and r["command"] == "pack"), None)
            sizes.append("%s %s: archive %s B, codebook %s B%s" % (
                s, p, "{:,}".format(int(ex["archive_bytes"])),
                "{:,}".format(int(ex.get("codebook_bytes", 0))),
                (", archive / fp16 %.3f" % (int(ex["archive_bytes"]) / raw)) if raw else ""))
    notes = ["%s %s: %s" % (s, p, w) for (s, p), v in sorted(extra.items())
             for k, w in sorted(v.items()) if k.startswith("note")]
    out.append("")
    if notes:
        out.append("Skipped parts: " + "; ".join(notes))
    out.append("Run: " + ", ".join("%s %s" % kv for kv in meta.items()))
    if sizes:
        out.append("Sizes: " + "; ".join(sizes))
    return "\n".join(out)


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter
    except ImportError:
        print("scale_report.py: no matplotlib in %s: %s not written" % (sys.executable, path),
              file=sys.stderr)
        return
    cmds = ["pack", "unpack", "verify", "restore", "zstd -3 -T0", "cp + sync", "pread (dd)"]
    threads = sorted({r["threads"] for r in rows})
    series = {}
    for r in rows:
        # an anchor does not depend on the thread count it was paired with:
        # drawn once, from the pairs of the first count
        if r["command"] in cmds and not (r["command"] in ANCHOR.values()
                                         and r["threads"] != threads[0]):
            series.setdefault((r["command"], r["threads"]), {}).setdefault(r["shape"], []).append(r)
    keys = sorted(series, key=lambda k: (cmds.index(k[0]), k[1]))
    cmap = plt.get_cmap("tab10")
    colour = {k: cmap(i % 10) for i, k in enumerate(keys)}
    shapes = [s for s in SHAPES if any(s in v for v in series.values())]
    shapes += sorted({s for v in series.values() for s in v} - set(shapes))
    xs = sorted({r["positions"] for r in rows if r["command"] in cmds})
    # one column per shape: wall time above, peak RSS below
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.6 * len(shapes) + 2.2, 8.5),
                             squeeze=False)
    for j, s in enumerate(shapes):
        dims = next(("%dx%dx%d" % (r["layers"], r["heads"], r["dim"]) for r in rows
                     if r["shape"] == s), "")
        for i, (field, label) in enumerate((("wall_s", "wall time, s (median)"),
                                            ("peak_rss_mib", "peak RSS, MiB (max)"))):
            ax = axes[i][j]
            for k in keys:
                rs = sorted(series[k].get(s, []), key=lambda r: r["positions"])
                if not rs:
                    continue
                anchor = k[0] in ANCHOR.values()
                ax.plot([r["positions"] for r in rs], [max(r[field], 1e-5) for r in rs],
                        color=colour[k], marker="o", ms=4, linestyle="--" if anchor else "-",
                        lw=1 if anchor else 1.8, alpha=0.8 if anchor else 1.0)
            if field == "wall_s" and len(xs) > 1:
                # slope 1 from the smallest pack time: cost linear in positions
                base = [r for r in rows if r["shape"] == s and r["command"] == "pack"
                        and r["positions"] == xs[0] and r["threads"] == 1]
                if base:
                    y0 = base[0]["wall_s"]
                    ax.plot(xs, [y0 * x / xs[0] for x in xs], color="k", lw=0.8, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(xs)
            ax.set_xticklabels(["{:,}".format(x) for x in xs])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, which="major", alpha=0.3)
            if i == 0:
                ax.set_title("%s (%s)" % (s, dims))
            else:
                ax.set_xlabel("positions")
            if j == 0:
                ax.set_ylabel(label)
    handles = [Line2D([], [], color=colour[k], linestyle="--" if k[0] in ANCHOR.values() else "-",
                      label="%s (anchor)" % k[0] if k[0] in ANCHOR.values()
                      else "%s, %d thread%s" % (k[0], k[1], "" if k[1] == 1 else "s"))
               for k in keys]
    handles.append(Line2D([], [], color="k", lw=0.8, ls=":", label="linear (pack, 1 thread)"))
    fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
    fig.suptitle("FKVF cost against positions: time (top), peak memory (bottom)")
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / (4.6 * len(shapes) + 2.2), 0.96))
    fig.savefig(path, dpi=110)
    print("scale_report.py: wrote %s" % path, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", required=True)
    ap.add_argument("--extra", required=True)
    ap.add_argument("--threads-all", type=int, required=True)
    ap.add_argument("--runs", type=int, required=True)
    ap.add_argument("--meta", action="append", default=[])
    ap.add_argument("--json")
    ap.add_argument("--png")
    a = ap.parse_args()
    recs, extra = load(a)
    meta = dict(m.split("=", 1) for m in a.meta)
    meta["runs"] = a.runs
    meta["threads_all"] = a.threads_all
    rows = rows_of(recs, extra, a.threads_all)
    print(table(rows, extra, meta))
    if a.json:
        doc = dict(meta=meta, targets=TARGETS, rows=rows,
                   extra=[dict(shape=s, positions=p, **v) for (s, p), v in sorted(extra.items())])
        for r in rows:
            if r["target"]:
                r["target"] = dict(what=r["target"][0], met=r["target"][1])
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    if a.png:
        plot(rows, a.png)


if __name__ == "__main__":
    main()
