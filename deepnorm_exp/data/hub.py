"""`load_dataset` for hub ids and local directories laid out like the hub, with one-line failures.

Every cache `datasets` fills lies under the run's `paths.cache` (`hf_cache`), never the user's $HF_HOME
(`~/.cache/huggingface`): a run whose home is read-only, shared or absent still loads its data, and
`paths.cache` alone says where a run's data went. Two caches are involved: `datasets`' own (the Arrow
files of every split, and what `.map` derives from them), which `load_dataset` takes as `cache_dir=`, and
huggingface_hub's, where a hub dataset's files are downloaded, which has no such argument in `datasets`
(it reads `huggingface_hub.constants.HF_HUB_CACHE` at each download): `hf_caches` points both there for
the duration of a load. Text files (`load_dataset("text", ...)`) are loaded the same way.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator, Optional

from ..errors import ConfigError, first_line

HF_DIR = "huggingface"  # under paths.cache, beside the harness's own data/ entries


def hf_cache(cache_dir: str | Path) -> Path:
    """Where `datasets` and huggingface_hub cache for a run whose `paths.cache` is `cache_dir`."""
    return Path(cache_dir) / HF_DIR


@contextlib.contextmanager
def hf_caches(cache_dir: str | Path) -> Iterator[Path]:
    """Within the block, `datasets`' and huggingface_hub's caches are under `hf_cache(cache_dir)`; yields
    the directory to pass to `load_dataset(..., cache_dir=)`. The hub's cache is a module constant that
    huggingface_hub reads at each download (and hf_xet reads HF_XET_CACHE from the environment): both are
    restored on leaving, so nothing else in the process sees them changed."""
    import huggingface_hub.constants as hub

    root = hf_cache(cache_dir)
    saved_hub, saved_xet = hub.HF_HUB_CACHE, os.environ.get("HF_XET_CACHE")
    hub.HF_HUB_CACHE = str(root / "hub")
    os.environ["HF_XET_CACHE"] = str(root / "xet")
    try:
        yield root / "datasets"
    finally:
        hub.HF_HUB_CACHE = saved_hub
        if saved_xet is None:
            os.environ.pop("HF_XET_CACHE", None)
        else:
            os.environ["HF_XET_CACHE"] = saved_xet


def load_hub(path: str, config: Optional[str], split: str, cache_dir: str | Path, key: str = "data.path"):
    """One split of a hub dataset (or of a local directory of parquet/json/csv files laid out like one),
    cached under `cache_dir` (the run's `paths.cache`), never the user's $HF_HOME.

    Where the hub is unreachable and the cache lacks the dataset, `datasets` raises one of several
    exception types with multi-line messages; the user gets one line naming the way out instead.
    """
    from datasets import load_dataset

    try:
        with hf_caches(cache_dir) as datasets_cache:
            return load_dataset(path, config, split=split, cache_dir=str(datasets_cache))
    except (ConnectionError, OSError, ValueError, FileNotFoundError) as e:
        if Path(path).is_dir():  # a local copy: the network is not the problem, datasets' message says what is
            raise ConfigError(key, path, f"split {split!r}: {first_line(e)}") from None
        raise ConfigError(key, path,
                          f"could not load split {split!r} ({type(e).__name__}); the hub is unreachable "
                          f"and `datasets` found no copy under {hf_cache(cache_dir)}: download it where the hub is reachable "
                          f"(into the same paths.cache), or set HF_HUB_OFFLINE=1 with a filled cache, or point "
                          f"{key} at a local copy") from None
