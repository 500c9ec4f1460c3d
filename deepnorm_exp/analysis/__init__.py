"""Reading `runs/` and drawing the DeepNet paper's comparisons (the notebooks and `deepnorm_exp.analysis.report`).

    runs = load_runs("runs/paper_depth_sweep")      # one row per run: summary + flattened config
    scalars = load_scalars(runs)                    # metrics.jsonl of every run
    layers = load_layer_records(runs)               # per-layer vectors of every run (one run: load_layers(dir))
    fig = plots.depth_stability(runs)
"""

from ..sinks.layers import load_layers
from . import plots
from .runs import at_one_lr, load_events, load_frontier, load_layer_records, load_runs, load_scalars, read_jsonl, run_dirs
from .tables import comparison_table

__all__ = ["plots", "at_one_lr", "load_runs", "load_scalars", "load_events", "load_layer_records", "load_frontier",
           "read_jsonl", "load_layers", "run_dirs", "comparison_table"]
