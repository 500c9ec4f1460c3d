"""`make bench`: the harness against a bare PyTorch loop of the same model, measured side by side.

Reports ratios from one run (absolute times on a shared 2-core machine are noisy):
  * training step time at depth 1,000 (d_model 64, 4 heads, seq 64, batch 8), harness / bare loop;
  * peak memory at depths 100 and 1,000: bare loop, harness, harness with activation checkpointing, as the
    process's peak RSS minus its RSS after imports (libraries differ: the harness also loads datasets and
    Hydra), and as the whole process's peak RSS; and the harness's own estimate of it (train/memory.py);
  * time from command to first step at depth 6 (data cache warm), with W&B offline and without;
  * the text pipeline (bench_data.py): cold and warm cache times on a 100 MB file, loader vs a depth-1,000 step;
  * the schemes that change the training step: sigma_reparam vs pre, admin vs post (+ its profiling pass);
  * the cost of instrumentation (deepnorm_exp/metrics/): step time with metrics off, with every metric on
    every step, and with the scalars only on every step, at depths 100 and 1,000; from these the overhead
    at the default intervals (log_every 10, layer_every 50) is derived, and at depth 100 also measured
    directly over 100 steps.
Harness step times are wall-clock from one step's end to the next (everything the loop and its callbacks
do), after the first two steps. Each measurement runs in its own process so peak memory is that configuration's alone. Never a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # `-m benchmarks.*` children run from the repository root

SHAPE = ["model.d_model=64", "model.n_heads=4", "model.d_ff=256", "train.seq_len=64", "train.batch_size=8"]


# --- the bare loop: the same DeepNorm decoder written plainly, no harness code ------------------------
def bare_step_times(depth: int, steps: int) -> list[float]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, heads, d_ff, seq, batch, vocab = 64, 4, 256, 64, 8, 256
    alpha, beta = (2 * depth) ** 0.25, (8 * depth) ** -0.25
    torch.set_flush_denormal(True)  # as the harness does by default (train.flush_denormal): the same arithmetic

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            with torch.no_grad():
                for i, gain in enumerate((1.0, 1.0, beta)):
                    nn.init.xavier_normal_(self.qkv.weight[i * d:(i + 1) * d], gain=gain)
                for lin in (self.out, self.fc1, self.fc2):
                    nn.init.xavier_normal_(lin.weight, gain=beta)
                for lin in (self.qkv, self.out, self.fc1, self.fc2):
                    lin.bias.zero_()

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = self.ln1(alpha * x + self.out(a))
            return self.ln2(alpha * x + self.fc2(F.gelu(self.fc1(x))))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(depth))

        def forward(self, tokens):
            x = self.embed(tokens) * math.sqrt(d)
            for block in self.blocks:
                x = block(x)
            return x @ self.embed.weight.t()

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=0.0, foreach=True)
    data = torch.randint(0, vocab, (64, seq + 1))
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        tokens = data[torch.randint(0, 64, (batch,))]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


# --- the harness: the real run path (trainer, callbacks, sinks), step times from metrics.jsonl --------
# Encoder-decoder at the decoder's token count: 8 pairs of 63 source and 64 target-input tokens per step.
ENCDEC = ["model=encdec", "data.translation_min_len=63", "data.translation_max_len=63", "data.eval_decode=8"]


def harness_step_times(depth: int, steps: int, checkpointing: bool, root: Path, extra: list[str]) -> list[float]:
    from deepnorm_exp import compose
    from deepnorm_exp.lifecycle.run import run_experiment
    from deepnorm_exp.train.trainer import Callback

    class StepClock(Callback):
        """Wall time from the end of one step to the end of the next: the loop, every callback, the sinks."""

        def __init__(self):
            self.times, self.last = [], None

        def on_train_start(self, trainer):
            self.last = time.perf_counter()

        def on_step_end(self, trainer, out):
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    clock = StepClock()
    overrides = [*SHAPE, "norm=deepnorm", f"depth={depth}", f"train.steps={steps}", "train.log_every=1",
                 "metrics=off", f"train.eval_every={steps}", "logger=none", f"paths.runs={root}",
                 "experiment_name=bench", "data.eval_sequences=8", "resume=false",  # every round trains again
                 f"model.activation_checkpointing={str(checkpointing).lower()}", *extra]
    cfg = compose(list({o.split("=")[0]: o for o in overrides}.values()))  # a later value of a key wins
    run_experiment(cfg, progress=False, callbacks=[clock])
    return clock.times[:-1]  # the last step also evaluates


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    if args.child == "harness":
        from deepnorm_exp import data  # noqa: F401 - libraries in memory before the baseline is read
        from deepnorm_exp.data import synthetic  # noqa: F401
        from deepnorm_exp.lifecycle import run  # noqa: F401
    import torch._dynamo  # noqa: F401 - torch.optim imports it on first use; count it in the baseline
    baseline = current_rss_mb()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if args.child == "bare":
        times = bare_step_times(args.depth, args.steps)
    else:
        times = harness_step_times(args.depth, args.steps, args.checkpointing, Path(args.root),
                                   (ENCDEC if args.encdec else []) + json.loads(args.overrides))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"step_times": times, "peak_rss_mb": usage.ru_maxrss / 1024, "train_mb": usage.ru_maxrss / 1024 - baseline,
                      "page_faults_per_step": (usage.ru_minflt - faults) / len(times)}))


@dataclass(frozen=True)
class ChildOptions:
    """How a measuring child trains, besides its depth and steps."""

    checkpointing: bool = False  # activation checkpointing
    threads: int = 2
    encdec: bool = False  # the encoder-decoder instead of the decoder
    overrides: tuple[str, ...] = ()  # the harness child's extra overrides
    env: dict | None = None  # environment variables to set (None as a value: unset)


def measure(kind: str, depth: int, steps: int, root: Path, **options) -> dict:
    """A fresh child process's step times and memory; `options`: ChildOptions's fields."""
    child = ChildOptions(**options)
    cmd = [sys.executable, "-m", "benchmarks.bench", "--child", kind, "--depth", str(depth), "--steps",
           str(steps), "--root", str(root), "--threads", str(child.threads),
           "--overrides", json.dumps(list(child.overrides))]
    cmd += (["--checkpointing"] if child.checkpointing else []) + (["--encdec"] if child.encdec else [])
    environment = {k: v for k, v in {**os.environ, **(child.env or {})}.items() if v is not None}  # None: unset
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=environment, cwd=REPO)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    times = sorted(result["step_times"][2:])  # the first steps pay for allocations and warm-up
    result["median_step_s"] = times[len(times) // 2]
    result["mean_step_s"] = sum(times) / len(times)
    return result


def admin_profile_seconds(depth: int) -> float:
    """Wall time of Admin's profiling pass (one forward of a training batch) at `depth`, in this process."""
    import torch

    from deepnorm_exp import build_model, compose
    from deepnorm_exp.build import make_scheme

    cfg = compose([*SHAPE, "norm=admin", f"depth={depth}"])
    scheme = make_scheme(cfg)
    model = build_model(cfg, scheme)
    batch = {"tokens": torch.randint(0, 256, (8, 65))}
    scheme.prepare(model, batch)  # warm-up
    started = time.perf_counter()
    scheme.prepare(model, batch)
    return time.perf_counter() - started


def schemes_section(depth: int, steps: int, rounds: int, root: Path) -> None:
    """Schemes that change the training step: sigma-Reparam (a power-iteration step per linear map per
    forward) against Pre-LN, its base; Admin against Post-LN, plus its one profiling pass."""
    runs = {name: [] for name in ("pre", "sigma_reparam", "post", "admin")}
    for _ in range(rounds):
        for name, results in runs.items():
            results.append(measure("harness", depth, steps, root, overrides=[f"norm={name}"]))
    best = {name: min(r["median_step_s"] for r in results) for name, results in runs.items()}
    profile = admin_profile_seconds(depth)
    print(f"schemes at depth {depth}: sigma_reparam {best['sigma_reparam']:.3f} s/step = "
          f"{best['sigma_reparam'] / best['pre']:.2f}x pre ({best['pre']:.3f}); admin {best['admin']:.3f} s/step = "
          f"{best['admin'] / best['post']:.2f}x post ({best['post']:.3f}), plus its profiling pass once per run: "
          f"{profile:.3f} s = {profile / best['admin']:.2f} of a step")


# Instrumentation variants: overrides on top of the harness child's (which has metrics=off, log_every=1).
INSTRUMENTATION = {
    "off": [],
    "scalars every step": ["metrics=default", "metrics.layer_every=0"],
    "all every step": ["metrics=default", "metrics.layer_every=1"],
}
DEFAULT_INTERVALS = (10, 50)  # train.log_every, metrics.layer_every of the default config


def instrumentation_section(depths: tuple[int, ...], steps: int, rounds: int, root: Path, direct_steps: int,
                            direct_depth: int) -> None:
    print("instrumentation (metrics/), every metric, probe_batch 2; step s = median after 2 warm-up steps")
    log_every, layer_every = DEFAULT_INTERVALS
    for depth in depths:
        runs = {name: [] for name in INSTRUMENTATION}
        for _ in range(rounds):  # alternate the variants, keep each one's least disturbed round
            for name, overrides in INSTRUMENTATION.items():
                runs[name].append(measure("harness", depth, steps, root, overrides=overrides))
        t = {name: min(r["median_step_s"] for r in results) for name, results in runs.items()}
        per_log, per_layer = t["scalars every step"] - t["off"], t["all every step"] - t["scalars every step"]
        derived = (per_log / log_every + per_layer / layer_every) / t["off"]
        print(f"  depth {depth}: off {t['off']:.3f} s/step; scalars every step {t['scalars every step'] / t['off']:.2f}x; "
              f"all every step {t['all every step'] / t['off']:.2f}x; at log_every={log_every}, "
              f"layer_every={layer_every}: +{100 * derived:.1f}% (derived: costs per measured step / intervals)")
    # Directly: the default config against metrics off, mean over `direct_steps` steps (the noise floor of
    # this machine is a few percent, so read it beside the derived figure).
    direct = {"off": [], "default": []}
    for _ in range(rounds):
        direct["off"].append(measure("harness", direct_depth, direct_steps, root, overrides=["train.log_every=10"]))
        direct["default"].append(measure("harness", direct_depth, direct_steps, root,
                                         overrides=["metrics=default", "train.log_every=10"]))
    best = {name: min(r["mean_step_s"] for r in results) for name, results in direct.items()}
    print(f"  depth {direct_depth}, measured over {direct_steps} steps: default metrics {best['default']:.3f} s/step vs "
          f"off {best['off']:.3f} s/step: {100 * (best['default'] / best['off'] - 1):+.1f}%")


def memory_estimate_mb(depth: int, checkpointing: bool) -> float:
    """What train/memory.py estimates for the harness child's configuration (metrics off, SHAPE)."""
    from deepnorm_exp.build import make_scheme, model_depths
    from deepnorm_exp.compose import compose
    from deepnorm_exp.train.memory import estimate

    cfg = compose([*SHAPE, "norm=deepnorm", f"depth={depth}", "metrics=off",
                   f"model.activation_checkpointing={str(checkpointing).lower()}"])
    return estimate(cfg, make_scheme(cfg), model_depths(cfg), cfg.train.seq_len, weight_copy=False).total_bytes / 2**20


def memory_section(depths: tuple[int, ...], steps: int, root: Path, rows: dict) -> None:
    """The training-memory estimate (the refusal before building uses it) against the measured train MB."""
    print("memory estimate (train/memory.py) vs measured train MB (peak RSS minus RSS after imports)")
    for depth in depths:
        for checkpointing in (False, True):
            name = "harness_ckpt" if checkpointing else "harness"
            measured = rows.get(depth, {}).get(name) or measure("harness", depth, steps, root, checkpointing=checkpointing)
            guess = memory_estimate_mb(depth, checkpointing)
            print(f"  depth {depth}{' checkpointing' if checkpointing else ''}: estimate {guess:.0f} MB, "
                  f"measured {measured['train_mb']:.0f} MB, estimate / measured {guess / measured['train_mb']:.2f}")


def compile_section(depths: tuple[int, ...], steps: int, root: Path) -> None:
    """train.compile=true against eager, each in a fresh process with an empty Inductor cache: the first
    step's extra time is the compilation; the median later step is the steady state."""
    print(f"{'depth':>6} {'variant':<9} {'first step s':>13} {'step s':>7} {'vs eager':>9}")
    for depth in depths:
        rows = {}
        for variant, extra in (("eager", []), ("compiled", ["train.compile=true"])):
            cache = root / f"inductor-{variant}-{depth}"
            rows[variant] = measure("harness", depth, steps, root, overrides=extra,
                                    env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
        for variant, row in rows.items():
            ratio = row["median_step_s"] / rows["eager"]["median_step_s"]
            print(f"{depth:>6} {variant:<9} {row['step_times'][0]:>13.2f} {row['median_step_s']:>7.3f} {ratio:>9.2f}")
        compile_s = rows["compiled"]["step_times"][0] - rows["eager"]["step_times"][0]
        print(f"{depth:>6} compilation (first step, compiled - eager): {compile_s:.1f} s")


COMPETITOR = """
import sys, time, torch
torch.set_num_threads(2)
a = torch.randn(256, 256)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:  # another user's job: busy on both cores
    a = torch.tanh(a @ a)
"""


def threads_section(root: Path, steps: int) -> None:
    """Depth-6 steps (the quick start's shape) under OpenMP settings, alone and beside a process that keeps
    both cores busy (another job on the same machine): median step seconds, and busy / quiet."""
    variants = [  # (torch threads, label, environment)
        (2, "spin 300000 (libgomp's default)", {"GOMP_SPINCOUNT": "300000"}),
        (2, "GOMP_SPINCOUNT=100000", {"GOMP_SPINCOUNT": "100000"}),
        (2, "OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}),
        (1, "1 thread", {}),
    ]
    print(f"{'threads':>7} {'OpenMP waiting':<33} {'quiet s':>8} {'busy s':>8} {'busy/quiet':>11}")
    for threads, label, env in variants:
        quiet = measure("harness", 6, steps, root, threads=threads, env=env)["median_step_s"]
        # The other job keeps libgomp's own default, whatever this one uses.
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR, "600"],
                                      env={**os.environ, "GOMP_SPINCOUNT": "300000"})
        try:
            busy = measure("harness", 6, steps, root, threads=threads, env=env)["median_step_s"]
        finally:
            competitor.kill()
            competitor.wait()
        print(f"{threads:>7} {label:<33} {quiet:>8.4f} {busy:>8.4f} {busy / quiet:>11.1f}")


GPU_SHAPE = ["model.d_model=1024", "model.n_heads=16", "model.d_ff=4096", "depth=100", "train.precision=bf16",
             "device=cuda", "train.batch_size=32", "train.seq_len=512", "model.max_seq_len=512",
             "data.train_sequences=4096", "data.eval_sequences=64", "metrics=off", "logger=none", "resume=false"]


def run_dir_type():
    """deepnorm_exp.rundir.RunDir, imported when called: the bare child (`--child bare`) must not load the
    harness, whose import would be in its peak memory."""
    from deepnorm_exp.rundir import RunDir

    return RunDir


def cli_summary(root: Path, *overrides: str, timeout: float = 900) -> dict:
    """Run `python -m deepnorm_exp <overrides>` under `root`; its summary.json (a run that outlives `timeout`
    is stopped and reported as such; with under 5 s left, none is started)."""
    RunDir = run_dir_type()
    if timeout < 5:
        return {"status": "not run", "error": "the section's time budget is spent"}
    try:
        result = subprocess.run([sys.executable, "-m", "deepnorm_exp", f"paths.runs={root}", *overrides],
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timed out", "error": f"stopped after {timeout:.0f} s"}
    summaries = sorted(root.glob(f"*/*/{RunDir.SUMMARY}"), key=lambda p: p.stat().st_mtime)
    if result.returncode != 0 or not summaries:
        return {"status": "failed", "error": (result.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(summaries[-1].read_text())


def steady_state(summary: dict) -> dict:
    """A GPU run's figures: the median logged interval after the first (which pays for compilation and
    warm-up), the peak memory against the estimate, the wall time."""
    RunDir = run_dir_type()
    records = [json.loads(r) for r in RunDir(summary["run_dir"]).metrics.read_text().splitlines()]
    later = [r for r in records[1:] if "tokens_per_s" in r] or records

    def median(key):
        values = sorted(r[key] for r in later if r.get(key) is not None)
        return values[len(values) // 2] if values else None

    return {"tokens_per_s": median("tokens_per_s"), "mfu": median("mfu"), "flops_per_s": median("flops_per_s"),
            "peak_memory_gib": summary.get("peak_memory_gib"), "memory_estimate_gib": summary.get("memory_estimate_gib"),
            "wall_s": summary.get("wall_s"), "steps": summary.get("steps_completed"), "params": summary.get("params")}


def gpu_section(root: Path, budget_s: float = 540, results: Path | None = None) -> None:
    """The GPU path, unattended within `budget_s` on one GPU: d_model 1024 x depth 100 in bf16, eager and
    compiled (tokens/s, MFU, peak memory); a run killed with SIGKILL after its first checkpoint and re-run,
    against the straight run's losses; the paper's 1,000-layer model for 10 steps with what time is left.
    Each result is also appended to `results` (JSON lines) as it comes, so a stopped check keeps them."""
    import torch

    if not torch.cuda.is_available():
        print("gpu: no CUDA device here; section skipped")
        return
    deadline = time.monotonic() + budget_s
    print(f"gpu: {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)

    def left(share: float = 1.0, reserve: float = 0.0) -> float:
        return max(0.0, (deadline - time.monotonic() - reserve) * share)

    def report(label: str, summary: dict, **extra) -> None:
        row = {"label": label, "status": summary.get("status"), "error": summary.get("error"), **extra}
        if summary.get("status") == "completed":
            row.update(steady_state(summary))
        if results is not None:
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if summary.get("status") != "completed":
            print(f"  {label}: {row['status']} ({row['error']})", flush=True)
            return

        def shown(value, form):
            return "-" if value is None else format(value, form)

        print(f"  {label}: {shown(row['tokens_per_s'], ',.0f')} tokens/s, MFU {shown(row['mfu'], '.1%')} (steady "
              f"state), peak memory {shown(row['peak_memory_gib'], '.1f')} GiB (estimate "
              f"{shown(row['memory_estimate_gib'], '.1f')}), wall {shown(row['wall_s'], '.0f')} s for {row['steps']} "
              "steps", flush=True)

    for variant, extra, share in (("eager", [], 0.2), ("compiled", ["train.compile=true"], 0.3)):
        report(f"d1024 L100 bf16 seq 512 x 32 {variant}", cli_summary(
            root / f"gpu-{variant}", *GPU_SHAPE, "train.steps=40", "train.log_every=10", "train.eval_every=40",
            *extra, timeout=left(share)))
    # Kill and resume: two straight runs (the control: do two runs of one config agree at all?), then the
    # same run SIGKILLed once its step-10 checkpoint exists and re-run. Deterministic kernels: without them
    # CUDA's atomics (attention and embedding backward) let even two straight runs differ in the last bits.
    args = [*GPU_SHAPE[:-1], "depth=24", "train.steps=20", "train.log_every=1", "train.eval_every=20",
            "train.ckpt_every=10", "train.deterministic=true"]
    straight = [cli_summary(root / f"gpu-straight-{i}", *args, timeout=left(0.1)) for i in range(2)]
    killed_root = root / "gpu-killed"
    proc = subprocess.Popen([sys.executable, "-m", "deepnorm_exp", f"paths.runs={killed_root}", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until = time.monotonic() + left(0.1)
    while proc.poll() is None and not list(killed_root.glob("*/*/checkpoint.pt")) and time.monotonic() < until:
        time.sleep(0.05)
    killed_at_checkpoint = proc.poll() is None and bool(list(killed_root.glob("*/*/checkpoint.pt")))
    proc.kill()
    proc.wait()
    resumed = cli_summary(killed_root, *args, timeout=left(0.15))

    def losses(directory: Path) -> list:
        RunDir = run_dir_type()
        found = list(directory.glob(f"*/*/{RunDir.METRICS}"))
        return [json.loads(r)["loss"] for r in found[0].read_text().splitlines()] if found else []

    first, second, after_kill = losses(root / "gpu-straight-0"), losses(root / "gpu-straight-1"), losses(killed_root)
    control, same = first == second != [], first == after_kill != []
    print(f"  kill -9 after the step-10 checkpoint ({'killed while running' if killed_at_checkpoint else 'NOT killed mid-run'}), "
          f"re-run: {resumed.get('status')} ({resumed.get('error')}), resumed from step {resumed.get('resumed_from_step')}, "
          f"losses {'identical to' if same else 'DIFFERENT from'} the straight run's; two straight runs "
          f"{'identical' if control else 'DIFFERENT'} ({', '.join(str(s.get('status')) for s in straight)})", flush=True)
    errors = [s.get("error") for s in (resumed, *straight) if s.get("error")]
    if results is not None:
        with results.open("a") as f:
            f.write(json.dumps({"label": "kill and resume", "killed_mid_run": killed_at_checkpoint,
                                "straight": [s.get("status") for s in straight], "resumed": resumed.get("status"),
                                "resumed_from_step": resumed.get("resumed_from_step"), "identical_losses": same,
                                "straight_runs_identical": control, "losses": [first, second, after_kill],
                                "errors": errors}) + "\n")
    report("paper_1000l (500L-500L, 3.68B)", cli_summary(
        root / "gpu-1000l", "experiment=paper_1000l", "device=cuda", "train.steps=10", "train.log_every=5",
        "train.eval_every=10", "metrics=off", "logger=none", "resume=false", timeout=left()))


def time_to_first_step(root: Path, logger: str) -> float:
    """Seconds from launching the command to the first metrics record on disk (depth 6, cache warm)."""
    RunDir = run_dir_type()
    run_root = root / f"first-step-{logger}"
    cmd = [sys.executable, "-m", "deepnorm_exp", "depth=6", "train.steps=3", "train.log_every=1", f"logger={logger}",
           f"paths.runs={run_root}", f"paths.cache={root / 'cache'}"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = math.nan
    while proc.poll() is None or math.isnan(elapsed):
        metrics = list(run_root.glob(f"*/*/{RunDir.METRICS}"))
        if metrics and metrics[0].read_text().strip():
            elapsed = time.perf_counter() - started
            break
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    proc.wait()
    return elapsed


PREFLIGHT_CHILD = """
import json, sys, time
started = time.perf_counter()
from deepnorm_exp.preflight import JobComposer, hydra_command, planned_jobs, preflight
from deepnorm_exp.__main__ import train
from hydra_plugins.deepnorm_exp_frontier._hydra_internals import args_parser
from hydra.types import RunMode
imported = time.perf_counter()
argv = sys.argv[1:]
jobs, _ = preflight(argv)
checked = time.perf_counter()
with hydra_command(args_parser().parse_args(argv), train) as command:  # Hydra's own, one per job
    master = command.compose(command.overrides, RunMode.MULTIRUN)
    for job in planned_jobs(command, master, train)[0]:
        command.config_loader.load_sweep_config(master, job)
print(json.dumps({"jobs": len(jobs), "imports": imported - started, "check": checked - imported,
                  "hydra_compositions": time.perf_counter() - checked}))
"""


def preflight_timing(root: Path) -> dict:
    """The pre-flight check of experiment=paper_depth_sweep (54 jobs) in a fresh process, and Hydra's own
    composition of the same 54 jobs (what its basic sweeper does again before launching them)."""
    out = subprocess.run([sys.executable, "-c", PREFLIGHT_CHILD, "-m", "experiment=paper_depth_sweep",
                          f"paths.runs={root / 'preflight'}"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def decoder_section(b: "Bench") -> None:
    for depth in (b.shallow, b.deep):
        # Bare and harness alternate, `rounds` times each; each keeps its least disturbed round.
        runs = {"bare": [], "harness": [], "harness_ckpt": []}
        for _ in range(b.args.rounds):
            runs["bare"].append(measure("bare", depth, b.args.steps, b.root))
            runs["harness"].append(measure("harness", depth, b.args.steps, b.root))
        runs["harness_ckpt"].append(measure("harness", depth, b.args.steps, b.root, checkpointing=True))
        b.rows[depth] = {name: min(results, key=lambda r: r["median_step_s"]) for name, results in runs.items()}
    print_decoder_table(b.rows)


def encdec_section(b: "Bench") -> None:
    layers = b.shallow  # 100L-100L against a 200-layer decoder
    pair = {"encdec": [], "decoder": []}
    for _ in range(b.args.rounds):
        pair["encdec"].append(measure("harness", layers, b.args.steps, b.root, encdec=True))
        pair["decoder"].append(measure("harness", 2 * layers, b.args.steps, b.root))
    best = {name: min(results, key=lambda r: r["median_step_s"]) for name, results in pair.items()}
    ratio = best["encdec"]["median_step_s"] / best["decoder"]["median_step_s"]
    print(f"encoder-decoder {layers}L-{layers}L: {best['encdec']['median_step_s']:.3f} s/step, "
          f"{ratio:.2f}x the {2 * layers}-layer decoder ({best['decoder']['median_step_s']:.3f} s/step); "
          f"train MB {best['encdec']['train_mb']:.0f} vs {best['decoder']['train_mb']:.0f}")


def startup_section(b: "Bench") -> None:
    subprocess.run([sys.executable, "-m", "deepnorm_exp", "depth=1", "train.steps=1", "logger=none",
                    f"paths.runs={b.root / 'warm'}", f"paths.cache={b.root / 'cache'}"], check=True,
                   capture_output=True)  # build the data cache once
    first = {logger: time_to_first_step(b.root, logger) for logger in ("none", "wandb")}
    print(f"command to first step at depth 6: {first['none']:.2f} s (logger=none), "
          f"{first['wandb']:.2f} s (logger=wandb, offline)")
    check = preflight_timing(b.root)
    print(f"pre-flight check of experiment=paper_depth_sweep ({check['jobs']} jobs): {check['check']:.2f} s "
          f"after {check['imports']:.2f} s of imports; Hydra composing each job once: "
          f"{check['hydra_compositions']:.2f} s ({check['hydra_compositions'] / check['check']:.1f}x the check)")


def data_bench_section(b: "Bench") -> None:
    from benchmarks.bench_data import data_section

    step = b.rows[b.deep]["harness"] if b.deep in b.rows else measure("harness", b.deep, b.args.steps, b.root)
    data_section(b.root, b.args.data_megabytes, step["median_step_s"] if b.deep == 1000 else None)


def denormal_section(b: "Bench") -> None:
    """Deep Post-LN's vanishing gradient computes with subnormal floats in its backward pass, which x86 CPUs
    handle far slower than normal ones: Post-LN and Pre-LN at depth 200 with train.flush_denormal on and off."""
    depth, steps = 2 * b.shallow, max(b.args.steps, 12)
    # At the full rate from the first step (no warm-up), so that Post-LN's LN inputs grow and its bottom
    # gradients fall into the subnormal range within the measured steps, as they do in a run's first hundred.
    print(f"subnormal floats (train.flush_denormal), depth {depth}, lr 1e-3 without warm-up, {steps} steps; "
          "step s = median after the first 2")
    print(f"{'norm':>6} {'flushed s':>10} {'kept s':>8} {'kept/flushed':>13}")
    for norm in ("post", "pre"):
        t = {flush: min(measure("harness", depth, steps, b.root, overrides=[
            f"norm={norm}", f"train.flush_denormal={flush}", "train.warmup_steps=0"])["median_step_s"]
                        for _ in range(b.args.rounds)) for flush in ("true", "false")}
        print(f"{norm:>6} {t['true']:>10.3f} {t['false']:>8.3f} {t['false'] / t['true']:>13.2f}")


class Bench:
    """What the sections share: the arguments, a scratch root, the two depths, the decoder section's rows."""

    def __init__(self, args: argparse.Namespace, root: Path):
        self.args, self.root, self.rows = args, root, {}
        self.deep, self.shallow = (100, 10) if args.quick else (1000, 100)


# Each section, run in this order when asked for; each records what it printed (benchmarks/records.py).
SECTIONS = {
    "decoder": decoder_section,
    "memory": lambda b: memory_section((b.shallow, b.deep), b.args.steps, b.root, b.rows),
    "encdec": encdec_section,
    "startup": startup_section,
    "instrumentation": lambda b: instrumentation_section((b.shallow, b.deep), b.args.steps, b.args.rounds, b.root,
                                                         direct_steps=102, direct_depth=b.shallow),
    "data": data_bench_section,
    "schemes": lambda b: schemes_section(b.shallow, b.args.steps, b.args.rounds, b.root),
    "compile": lambda b: compile_section((b.shallow, b.deep), b.args.steps, b.root),
    "threads": lambda b: threads_section(b.root, max(b.args.steps, 30)),
    "denormal": denormal_section,
    "gpu": lambda b: gpu_section(b.root, b.args.gpu_budget, Path(b.args.gpu_results) if b.args.gpu_results else None),
}
DEFAULT_SECTIONS = [name for name in SECTIONS if name != "gpu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", choices=["bare", "harness"])
    parser.add_argument("--depth", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternating bare/harness measurements per depth")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--encdec", action="store_true", help="child: the encoder-decoder model")
    parser.add_argument("--overrides", default="[]", help="child: JSON list of extra config overrides")
    parser.add_argument("--sections", default=",".join(DEFAULT_SECTIONS),
                        help="comma-separated: decoder (bare vs harness), memory (estimate vs measured), "
                             "gpu (the GPU path: one CUDA device; not in the default list), "
                             "compile (train.compile=true vs eager), threads (thread count and OpenMP "
                             "wait policy, alone and beside a busy process), "
                             "encdec (100L-100L vs 200L), startup, "
                             "instrumentation (metrics on vs off), data (text pipeline, bench_data.py), "
                             "schemes (sigma_reparam, admin: their step-time overhead), "
                             "denormal (deep Post-LN with subnormal floats flushed and kept)")
    parser.add_argument("--data-megabytes", type=int, default=100, help="size of the data section's text file")
    parser.add_argument("--root", default="")
    parser.add_argument("--gpu-budget", type=float, default=540, help="gpu: seconds for the whole section")
    parser.add_argument("--gpu-results", default="", help="gpu: also append each result to this JSON-lines file")
    parser.add_argument("--quick", action="store_true", help="depths 10 and 100 instead of 100 and 1,000")
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results"),
                        help="where each finished section's printed lines are kept (benchmarks/results/)")
    args = parser.parse_args()
    if args.child:
        return child(args)  # a child imports only what it measures: no records, no pandas
    from benchmarks.records import machine, recorded

    asked = args.sections.split(",")
    unknown = [name for name in asked if name not in SECTIONS]
    if unknown:
        parser.error(f"--sections {','.join(unknown)}: choose from {', '.join(SECTIONS)}")
    # A quick run measures other depths: its figures are not the page's, so it keeps no record by default.
    kept = parser.get_default("results")
    results = Path(args.results) if not args.quick or args.results != kept else None
    about = (f"d_model 64, 4 heads, seq 64, batch 8, {args.steps} steps, {args.rounds} alternating rounds, "
             + machine(args.threads))
    print(f"deepnorm_exp benchmark: {about}")
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args, Path(tmp))
        for name in (n for n in SECTIONS if n in asked):
            with (recorded(name, about, results) if results else contextlib.nullcontext()):
                SECTIONS[name](bench)


def print_decoder_table(rows: dict) -> None:
    print(f"{'depth':>6} {'variant':<13} {'step s':>7} {'vs bare':>8} {'train MB':>9} {'vs bare':>8} {'peak RSS MB':>12}")
    for depth, variants in rows.items():
        bare = variants["bare"]
        for name, r in variants.items():
            print(f"{depth:>6} {name:<13} {r['median_step_s']:>7.3f} {r['median_step_s'] / bare['median_step_s']:>8.2f} "
                  f"{r['train_mb']:>9.0f} {r['train_mb'] / bare['train_mb']:>8.2f} {r['peak_rss_mb']:>12.0f}")
    print("step s: median over the steps after the first two, best of the rounds; train MB: peak RSS minus the "
          "process's RSS after its imports (the memory training itself takes); peak RSS: the whole process")

if __name__ == "__main__":
    main()
