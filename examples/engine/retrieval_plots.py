#!/usr/bin/python3
"""The plots of docs/retrieval-study.md (issue 19 C.11), drawn from the study's outputs.

Reads, in DIR (default docs/retrieval-study):
  MODEL-wW.md            fkvf-attention outputs (attention mass a rule finds, by m and layer)
  MODEL-wW-rehydrate.md  fkvf-rehydrate outputs (perplexity change by rule and m); the
                         rows of MODEL-wW-rehydrate-chunk16.md, when there is one, replace
                         its rows of the same rules
for MODEL in stories260K and shakespeare-hd64, and writes there:
  attention-mass.png  the attention mass of the m positions each rule picks, by m, one panel
                      a model and window;
  perplexity.png      the perplexity change of attending to the exact window plus the m
                      positions a rule picks, by m (log scale; changes of 0.01% and below,
                      zero and negative ones too, drawn at 0.01%), one panel a model and
                      window that has a rehydrate output;
  layers.png          the attention mass by layer at the smallest m, one panel a model (the
                      window given by --layers-window, 32 by default).
usage: retrieval_plots.py [DIR] [--layers-window W]
"""

import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODELS = [("stories260K", "stories260K (head dim 8)"),
          ("shakespeare-hd64", "shakespeare-hd64 (head dim 64)")]
WINDOWS = [32, 8, 2]
# rules drawn, and their style: the comparison the study makes
STYLE = {
    "all archived": dict(color="0.6", ls=":", lw=1.5),
    "suffix matches": dict(color="tab:red", ls="-", marker="v"),
    "most recent": dict(color="tab:brown", ls="-", marker="s"),
    "random": dict(color="0.4", ls="--", marker="x"),
    "largest key norm": dict(color="tab:olive", ls="-", marker="d"),
    "heavy hitters (H2O)": dict(color="tab:purple", ls="-", marker="^"),
    "key symbols, stage 0 (pre-RoPE)": dict(color="tab:cyan", ls="--", marker="o"),
    "key symbols, refined (pre-RoPE)": dict(color="tab:blue", ls="-", marker="o", lw=2),
    "key symbols, refined (as-is)": dict(color="tab:green", ls="-", marker="o"),
    "oracle, one set for all heads": dict(color="0.35", ls="--"),
    "oracle top-m a head": dict(color="k", ls="-", lw=2),
}


def tables(path):
    """The markdown tables of a file: a list of (header cells, rows of cells)."""
    out, cur = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("|"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                if cur is None:
                    cur = (cells, [])
                elif not all(re.fullmatch(r"-+", c) for c in cells):
                    cur[1].append(cells)
            elif cur is not None:
                out.append(cur)
                cur = None
    if cur is not None:
        out.append(cur)
    return out


def number(cell):
    """The first number of a cell ('0.805 (246.5)', '+38.5% (+0.326 +- 0.012)'), or None."""
    m = re.match(r"^([+-]?[0-9.]+)", cell)
    return float(m.group(1)) if m else None


def by_m(table):
    """{rule: [(m, value)]} of a table whose header is rule, m = ..."""
    head, rows = table
    ms = [int(re.search(r"\d+", h).group()) for h in head[1:]]
    return {r[0]: [(m, number(c)) for m, c in zip(ms, r[1:]) if number(c) is not None]
            for r in rows}


def main():
    args = sys.argv[1:]
    lw = 32
    if "--layers-window" in args:
        i = args.index("--layers-window")
        lw = int(args[i + 1])
        del args[i:i + 2]
    d = args[0] if args else os.path.join(os.path.dirname(__file__), "..", "..", "docs",
                                          "retrieval-study")
    # attention mass by m
    fig, axes = plt.subplots(len(MODELS), len(WINDOWS), figsize=(15, 9), squeeze=False)
    for i, (mod, title) in enumerate(MODELS):
        for j, w in enumerate(WINDOWS):
            ax = axes[i][j]
            p = os.path.join(d, f"{mod}-w{w}.md")
            if not os.path.exists(p):
                ax.set_axis_off()
                continue
            t = by_m(tables(p)[0])
            for rule, st in STYLE.items():
                if rule in t and t[rule]:
                    xs, ys = zip(*t[rule])
                    ax.plot(xs, ys, label=rule, **st)
            ax.set_xscale("log", base=2)
            ax.set_xticks([16, 32, 64, 128])
            ax.set_xticklabels(["16", "32", "64", "128"])
            top = max(y for _, y in t.get("all archived", [(0, 1.0)]))
            ax.set_ylim(0, min(1.0, 1.08 * top))  # the mass there is to find
            ax.set_title(f"{title}, window 4 + {w}", fontsize=10)
            ax.set_xlabel("m (archived positions picked)")
            ax.set_ylabel("attention mass on them")
            ax.grid(alpha=0.3)
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=4, fontsize=9)
    fig.suptitle("Attention mass a rule finds (mean over steps, layers, heads)")
    fig.tight_layout(rect=(0, 0.1, 1, 0.96))
    fig.savefig(os.path.join(d, "attention-mass.png"), dpi=90)
    plt.close(fig)

    # perplexity by m
    panels = [(mod, title, w) for mod, title in MODELS for w in WINDOWS
              if os.path.exists(os.path.join(d, f"{mod}-w{w}-rehydrate.md"))]
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(max(11, 6 * len(panels)), 5.5),
                                 squeeze=False)
        for j, (mod, title, w) in enumerate(panels):
            ax = axes[0][j]
            p = os.path.join(d, f"{mod}-w{w}-rehydrate.md")
            with open(p, encoding="utf-8") as f:
                win = re.search(r"window only \(m = 0\): ([+-]?[0-9.]+)%", f.read())
            t = by_m(tables(p)[0])
            extra = os.path.join(d, f"{mod}-w{w}-rehydrate-chunk16.md")
            if os.path.exists(extra):
                t.update(by_m(tables(extra)[0]))
            for rule, st in STYLE.items():
                if rule in t and t[rule]:
                    xs, ys = zip(*t[rule])
                    ax.plot(xs, [max(y, 0.01) for y in ys], label=rule, **st)
            if win:
                ax.axhline(float(win.group(1)), color="tab:red", ls=":", lw=1,
                           label="window only (m = 0)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks([16, 32, 64, 128])
            ax.set_xticklabels(["16", "32", "64", "128"])
            ax.set_title(f"{title}, window 4 + {w}", fontsize=10)
            ax.set_xlabel("m (archived positions attention sees)")
            ax.set_ylabel("perplexity change (%)")
            ax.grid(alpha=0.3, which="both")
        h, lab = axes[0][0].get_legend_handles_labels()
        fig.legend(h, lab, loc="lower center", ncol=3, fontsize=9)
        fig.suptitle("Selective rehydration: the exact window plus m retrieved positions")
        fig.tight_layout(rect=(0, 0.18, 1, 0.95))
        fig.savefig(os.path.join(d, "perplexity.png"), dpi=90)
        plt.close(fig)

    # by layer, at the smallest m
    fig, axes = plt.subplots(1, len(MODELS), figsize=(14, 5), squeeze=False)
    for i, (mod, title) in enumerate(MODELS):
        ax = axes[0][i]
        p = os.path.join(d, f"{mod}-w{lw}.md")
        if not os.path.exists(p):
            ax.set_axis_off()
            continue
        tabs = tables(p)
        lt = next(t for t in tabs if len(t[0]) > 1 and t[0][1].startswith("layer"))
        layers = list(range(len(lt[0]) - 1))
        rows = {r[0]: [number(c) for c in r[1:]] for r in lt[1]}
        shown = [r for r in STYLE if r in rows]
        wd = 0.8 / len(shown)
        for k, rule in enumerate(shown):
            ax.bar([x + k * wd for x in layers], rows[rule], wd, label=rule,
                   color=STYLE[rule]["color"])
        ax.set_xticks([x + 0.4 - wd / 2 for x in layers])
        ax.set_xticklabels([f"layer {x}" for x in layers])
        ax.set_ylim(0, min(1.0, 1.08 * max(rows.get("all archived", [1.0]))))
        m = re.search(r"m = (\d+)", open(p, encoding="utf-8").read().split("By layer")[1])
        ax.set_title(f"{title}, window 4 + {lw}, m = {m.group(1) if m else '?'}", fontsize=10)
        ax.set_ylabel("attention mass")
        ax.grid(alpha=0.3, axis="y")
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=4, fontsize=9)
    fig.suptitle("Attention mass by layer")
    fig.tight_layout(rect=(0, 0.16, 1, 0.95))
    fig.savefig(os.path.join(d, "layers.png"), dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
