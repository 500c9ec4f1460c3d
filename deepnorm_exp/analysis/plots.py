"""The DeepNet paper's stability comparisons as matplotlib figures, shared by the notebooks and the report.

Each function takes DataFrames from `runs.py` (never reads files) and returns a `matplotlib.figure.Figure`
(no pyplot state: safe in scripts, notebooks and threads). One panel per normalization scheme where the
comparison is across depths; depth is always the colour (same colour for the same depth in every figure).
Diverged runs are marked with an "x" (artists with gid "diverged"; red, or the scheme's colour where
several schemes share an axis).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib import colormaps

from .runs import config_column

NORM_ORDER = ("post", "pre", "deepnorm")  # the paper's three first, other schemes after, alphabetically
DIVERGED = dict(marker="x", color="tab:red", linestyle="none", markersize=9, markeredgewidth=2, label="diverged",
                gid="diverged")


def norms_in(frame: pd.DataFrame) -> list[str]:
    present = [str(n) for n in pd.unique(frame["norm"])] if "norm" in frame else []
    return [n for n in NORM_ORDER if n in present] + sorted(n for n in present if n not in NORM_ORDER)


# the schemes' names as the paper writes them, where a page's sentence names one
NORM_NAMES = {"post": "Post-LN", "post_init": "Post-LN-init", "pre": "Pre-LN", "deepnorm": "DeepNorm"}


def norm_colors(norms: Sequence[str]) -> dict:
    """A distinct colour per scheme: tab10 up to ten schemes, tab20 beyond (the zoo has 14)."""
    cmap = colormaps["tab10" if len(norms) <= 10 else "tab20"]
    return {norm: cmap(i % cmap.N) for i, norm in enumerate(norms)}


def depth_color(depths: Sequence[int]):
    """depth -> colour on a log scale over the depths present."""
    values = sorted({int(d) for d in depths}) or [1]
    norm = LogNorm(vmin=min(values), vmax=max(max(values), min(values) + 1))
    cmap = colormaps["viridis"]
    return lambda depth: cmap(0.9 * norm(int(depth)))


def depth_axis(ax, depths) -> None:
    """Log-scaled depth axis, ticked at the depths present, labelled as plain integers."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sorted({int(d) for d in depths})))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


MAX_COLUMNS = 4  # the zoo has 21 schemes: panels wrap into rows of four


def panels(n: int, title: str, width: float = 4.2, height: float = 3.4, sharey: bool = True):
    """n panels in rows of at most MAX_COLUMNS; unused cells of the last row are removed."""
    n = max(n, 1)
    columns = min(n, MAX_COLUMNS)
    rows = math.ceil(n / columns)
    fig = Figure(figsize=(max(width * columns, 5), height * rows), layout="constrained")
    grid = fig.subplots(rows, columns, sharey=sharey, squeeze=False).reshape(-1)
    for ax in grid[n:]:
        fig.delaxes(ax)
    fig.suptitle(title)
    return fig, list(grid[:n])


def empty(title: str, why: str) -> Figure:
    fig = Figure(figsize=(6, 2), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    fig.suptitle(title)
    return fig


def _diverged(frame: pd.DataFrame) -> pd.Series:
    return frame["status"].eq("diverged") if "status" in frame else pd.Series(False, index=frame.index)


def _completed(frame: pd.DataFrame) -> pd.Series:
    return frame["status"].eq("completed") if "status" in frame else pd.Series(True, index=frame.index)


# -- 1. depth stability --------------------------------------------------------------------------------
def depth_stability(runs: pd.DataFrame, metrics: Sequence[str] = ("final_loss", "eval_loss", "excess_loss")) -> Figure:
    """Loss vs depth per norm (log depth axis): mean over seeds of the runs that completed, bars from
    the lowest to the highest seed; an x in the norm's colour at the top where any of its seeds diverged."""
    metrics = [m for m in metrics if m in runs and runs[m].notna().any()]
    if runs.empty or not metrics:
        return empty("Loss vs depth", "no finished runs with losses")
    fig, axes = panels(len(metrics), "Loss vs depth (mean over seeds, bars: min to max; x: diverged)", sharey=False)
    colors = norm_colors(norms_in(runs))
    for ax, metric in zip(axes, metrics):
        for norm in norms_in(runs):
            of_norm = runs[runs["norm"] == norm]
            healthy = of_norm[_completed(of_norm) & of_norm[metric].notna()]  # not stopped runs' last evals
            stats = healthy.groupby("depth")[metric].agg(["mean", "min", "max"]).sort_index()
            line = ax.errorbar(stats.index, stats["mean"], yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]],
                               marker="o", capsize=3, label=norm, color=colors[norm])
            lost = of_norm[_diverged(of_norm)].groupby("depth").size()
            if len(lost):  # at the top of the axes: a diverged run has no comparable loss
                ax.plot(lost.index, [0.97] * len(lost), transform=ax.get_xaxis_transform(), clip_on=False,
                        **{**DIVERGED, "color": line.lines[0].get_color(), "label": f"{norm} diverged"})
        depth_axis(ax, runs["depth"])
        ax.set_xlabel("depth (layers per stack)")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")  # beside the panels, never on data
    return fig


# -- 1b. the depth x learning-rate stability map ---------------------------------------------------------
def stability_map(runs: pd.DataFrame, frontier: Optional[pd.DataFrame] = None, lr_key: str = "train.lr") -> Figure:
    """Every run at (depth, lr), per norm: green o trained, orange o completed without learning, red x diverged,
    grey s failed; the frontier sweeper's largest stable lr per depth as a line where `frontier` is given."""
    if runs.empty or lr_key not in runs:
        return empty("Stability map", f"no runs with {lr_key}")
    norms = norms_in(runs)
    fig, axes = panels(len(norms), "Stability map: depth x learning rate")
    styles = {"trained": dict(marker="o", color="tab:green", linestyle="none", label="trained"),
              "untrained": dict(marker="o", color="tab:orange", linestyle="none", label="completed, not learned"),
              "diverged": DIVERGED,
              "failed": dict(marker="s", color="grey", linestyle="none", label="failed")}
    for ax, norm in zip(axes, norms):
        of_norm = runs[runs["norm"] == norm]
        kind = np.where(_diverged(of_norm), "diverged",
                        np.where(of_norm["status"].eq("completed"),
                                 np.where(of_norm.get("trained", pd.Series(True, index=of_norm.index)).fillna(True).astype(bool),
                                          "trained", "untrained"), "failed"))
        for name, style in styles.items():
            chosen = of_norm[kind == name]
            if len(chosen):
                ax.plot(chosen["depth"], chosen[lr_key], **style)
        if frontier is not None and len(frontier) and "norm" in frontier:
            cells = frontier[frontier["norm"].astype(str) == norm].copy()
            if len(cells):
                cells["depth"] = cells["depth"].astype(int)
                cells = cells.sort_values("depth")
                ax.plot(cells["depth"], cells["max_stable_lr"], "k--", label="max stable lr (frontier)")
        depth_axis(ax, runs["depth"])
        ax.set(yscale="log", xlabel="depth", title=norm)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("learning rate")
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    axes[-1].legend(handles.values(), handles.keys(), fontsize="small")
    return fig


def frontier_law(frontier: pd.DataFrame, fit: Optional[pd.DataFrame] = None) -> Figure:
    """Max stable lr against depth, log-log, all schemes on one axis: each cell's bracket (largest stable to
    smallest unstable rate) as a bar at its depth (seeds side by side), a censored cell as an arrow at the
    range's end it passed (v: not trained even at the lowest rate; ^: stable at the highest), the fitted law as a
    line, its slope and 95% interval in the legend (analysis/frontier_law.py)."""
    from .frontier_law import fit_frontier_law, frontier_cells

    if frontier is None or frontier.empty or "norm" not in frontier or "depth" not in frontier:
        return empty("Stability frontier across depth", "no frontier sweep (hydra/sweeper=frontier) under this root")
    cells = frontier_cells(frontier)
    fit = fit_frontier_law(frontier) if fit is None else fit
    fig, (ax,) = panels(1, "Stability frontier across depth", width=6.0, height=4.2)
    colors = norm_colors(sorted(cells["norm"].unique()))
    for norm, group in cells.groupby("norm", sort=True):
        x = group["depth"] * (1 + 0.03 * (group["seed"] - group["seed"].mean()))  # seeds side by side (log axis)
        used = group[~group["censored"] & ~group["error"]]
        mid = np.sqrt(used["lo"] * used["hi"])
        ax.errorbar(x[used.index], mid, yerr=[mid - used["lo"], used["hi"] - mid], fmt="o",
                    color=colors[norm], capsize=2, markersize=3)
        # censored cells are drawn, as arrows: the frontier lies below the lowest rate tried (not trained even
        # there: unstable, or too slow for the budget) or above the highest (stable there)
        for marker, at, which in (("v", "hi", group["censored"] & group["lo"].isna()),
                                  ("^", "lo", group["censored"] & group["hi"].isna())):
            if which.any():
                ax.plot(x[which], group.loc[which, at], marker, color=colors[norm], markersize=6,
                        linestyle="none", gid=f"censored-{marker}-{norm}")
        row = fit[fit["norm"] == norm]
        if len(row) and np.isfinite(row["slope"].iloc[0]):
            r = row.iloc[0]
            depths = np.array([min(r["depths"]), max(r["depths"])], dtype=float)
            ax.plot(depths, np.exp(r["intercept"]) * depths ** r["slope"], color=colors[norm],
                    label=f"{norm}: slope {r['slope']:.2f} [{r['slope_low']:.2f}, {r['slope_high']:.2f}]")
        else:
            ax.plot([], [], "o", color=colors[norm], label=f"{norm}: no slope (closed brackets at fewer than 2 depths)")
    if cells["censored"].any():
        ax.plot([], [], "v", color="0.4", linestyle="none", label="v / ^: frontier below / above the range")
    ax.set(yscale="log", xlabel="depth", ylabel="max stable learning rate")
    depth_axis(ax, cells["depth"])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


# -- 2. model update -----------------------------------------------------------------------------------
def model_update(scalars: pd.DataFrame, metric: str = "model_update", max_step: Optional[int] = None) -> Figure:
    """||F(x, θ_t) − F(x, θ_0)|| over the first steps, per norm, one line per depth (mean over seeds): the
    paper's figures 4 and 5, where Post-LN's update grows with depth and DeepNorm's stays small and flat."""
    if scalars.empty or metric not in scalars or scalars[metric].notna().sum() == 0:
        return empty("Model update", f"no {metric} records (metrics.model_update=true logs them)")
    data = scalars[scalars[metric].notna()]
    if max_step is not None:
        data = data[data["step"] <= max_step]
    norms = norms_in(data)
    color = depth_color(data["depth"])
    fig, axes = panels(len(norms), "Model update ||F(x,θt) − F(x,θ0)|| (RMS over positions)")
    for ax, norm in zip(axes, norms):
        for depth, rows in data[data["norm"] == norm].groupby("depth"):
            curve = rows.groupby("step")[metric].mean()
            ax.plot(curve.index, curve.values, color=color(depth), label=f"L={depth}")
        ax.set(yscale="log", xlabel="step", title=norm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel(metric)
    return fig


def _last_step_with(layers: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each run's rows at the last step where `metric` was measured."""
    rows = layers[layers[metric].notna()]
    last = rows.groupby(["experiment", "run_name"])["step"].transform("max")
    return rows[rows["step"] == last]


def _per_layer(ax, rows: pd.DataFrame, metric: str, color, scale: Optional[pd.Series] = None) -> None:
    for depth, of_depth in rows.groupby("depth"):
        values = of_depth[metric] / (scale.loc[of_depth.index] if scale is not None else 1.0)
        profile = values.groupby(of_depth["position"]).mean()  # mean over seeds (and over sublayers' entries)
        x = profile.index / max(profile.index.max(), 1)
        ax.plot(x, profile.values, color=color(depth), marker="." if len(profile) < 30 else None, label=f"L={depth}")


# -- 2b. LN input norm against sqrt(d) -----------------------------------------------------------------
def ln_input_norm(layers: pd.DataFrame, runs: pd.DataFrame, step: Optional[int] = None) -> Figure:
    """||x|| entering each LayerNorm, in units of sqrt(d), by relative position in the stack, per norm.
    1 (dashed) is where the LN passes the residual gradient unattenuated (||∂LN/∂x|| = O(sqrt(d)/||x||));
    DeepNorm's x is scaled by alpha on purpose, so its level sits near alpha."""
    metric = "ln_input_norm"
    if layers.empty or metric not in layers or layers[metric].notna().sum() == 0:
        return empty("LN input norm", "no per-layer activation records (metrics.activations=true logs them)")
    rows = layers[layers[metric].notna()]
    rows = rows[rows["step"] == step] if step is not None else _last_step_with(rows, metric)
    d_model = pd.Series(config_column(runs, "model.d_model").to_numpy(),
                        index=pd.MultiIndex.from_frame(runs[["experiment", "run_name"]]))
    d_model = d_model[~d_model.index.duplicated()]
    scale = np.sqrt(rows.set_index(["experiment", "run_name"]).index.map(d_model).astype(float))
    scale = pd.Series(np.asarray(scale), index=rows.index)
    rows, scale = rows[scale.notna()], scale[scale.notna()]  # d unknown: the run's config.yaml is unreadable
    if rows.empty:
        return empty("LN input norm", "model.d_model unknown (the runs' config.yaml unreadable)")
    norms = norms_in(rows)
    color = depth_color(rows["depth"])
    fig, axes = panels(len(norms), "LayerNorm input ||x|| / sqrt(d) by position (last per-layer step)")
    for ax, norm in zip(axes, norms):
        _per_layer(ax, rows[rows["norm"] == norm], metric, color, scale)
        ax.axhline(1.0, color="k", linestyle="--", linewidth=1)
        ax.set(yscale="log", xlabel="position in the stack (0 = bottom)", title=norm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel("||x|| / sqrt(d)")
    return fig


# -- 3. per-layer gradients and updates ----------------------------------------------------------------
def layer_profile(layers: pd.DataFrame, metric: str = "grad_norm", step: Optional[int] = None) -> Figure:
    """A per-layer metric (`grad_norm`, `update_ratio`, ...) by relative position, per norm, one line per depth
    (mean over seeds), at `step` or each run's last step measuring it. The paper: Post-LN's bottom layers get
    vanishing gradients, Pre-LN's bottom layers larger ones than its top, DeepNorm's profile is flat."""
    if layers.empty or metric not in layers or layers[metric].notna().sum() == 0:
        return empty(f"Per-layer {metric}", f"no per-layer {metric} records")
    rows = layers[layers[metric].notna()]
    rows = rows[rows["step"] == step] if step is not None else _last_step_with(rows, metric)
    norms = norms_in(rows)
    color = depth_color(rows["depth"])
    fig, axes = panels(len(norms), f"Per-layer {metric} by position in the stack")
    for ax, norm in zip(axes, norms):
        _per_layer(ax, rows[rows["norm"] == norm], metric, color)
        ax.set(yscale="log", xlabel="position in the stack (0 = bottom)", title=norm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel(metric)
    return fig


# -- 4. training curves --------------------------------------------------------------------------------
def training_curves(scalars: pd.DataFrame, runs: pd.DataFrame, metric: str = "loss") -> Figure:
    """Training loss of every run, per norm, coloured by depth; a red x at each diverged run's last record."""
    if scalars.empty or metric not in scalars:
        return empty("Training curves", "no scalar records")
    data = scalars[scalars[metric].notna()]
    norms = norms_in(data)
    color = depth_color(data["depth"])
    diverged = set(runs.loc[_diverged(runs), "run_name"]) if len(runs) else set()
    fig, axes = panels(len(norms), f"Training {metric} (x: diverged)")
    for ax, norm in zip(axes, norms):
        shown = set()
        for (depth, name), rows in data[data["norm"] == norm].groupby(["depth", "run_name"]):
            rows = rows.sort_values("step")
            values = rows[metric].where(np.isfinite(rows[metric]))
            label = None if depth in shown else f"L={depth}"
            shown.add(depth)
            ax.plot(rows["step"], values, color=color(depth), linewidth=1, label=label)
            if name in diverged:
                last = rows[np.isfinite(rows[metric])].tail(1)
                ax.plot(last["step"], last[metric], **{**DIVERGED, "label": None})
        ax.set(yscale="log", xlabel="step", title=norm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    axes[0].set_ylabel(metric)
    return fig


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    import io

    for text in _written_texts(fig):  # titles, labels, legends hold names from records: "$x$" is not mathtext
        text.set_parse_math(False)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()




def _written_texts(fig: Figure) -> list:
    """The texts the figure's code set (titles, labels, legends), not those its axes' formatters write (tick
    labels and offsets, which are mathtext on log axes: "$10^{-1}$")."""
    from matplotlib.text import Text

    formatted = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            formatted.add(axis.offsetText)
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                formatted.update((tick.label1, tick.label2))
    return [text for text in fig.findobj(Text) if text not in formatted]
