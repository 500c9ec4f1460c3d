"""`load_dataset` for hub ids and local directories laid out like the hub, with one-line failures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, first_line


def hub_cache() -> str:
    return os.environ.get("HF_DATASETS_CACHE", str(Path.home() / ".cache" / "huggingface" / "datasets"))


def load_hub(path: str, config: Optional[str], split: str, key: str = "data.path"):
    """One split of a hub dataset (or of a local directory of parquet/json/csv files laid out like one).

    Where the hub is unreachable and the cache lacks the dataset, `datasets` raises one of several
    exception types with multi-line messages; the user gets one line naming the way out instead.
    """
    from datasets import load_dataset

    try:
        return load_dataset(path, config, split=split)
    except (ConnectionError, OSError, ValueError, FileNotFoundError) as e:
        if Path(path).is_dir():  # a local copy: the network is not the problem, datasets' message says what is
            raise ConfigError(key, path, f"split {split!r}: {first_line(e)}") from None
        raise ConfigError(key, path,
                          f"could not load split {split!r} ({type(e).__name__}); the hub is unreachable "
                          f"and {hub_cache()} does not hold it: download it where the hub is reachable, or set "
                          f"HF_HUB_OFFLINE=1 with a filled cache, or point {key} at a local copy") from None
