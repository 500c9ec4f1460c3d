"""Reading a sharded checkpoint without running its content: DCP unpickles `.metadata` with plain
`pickle.load` and each non-tensor value with `torch.load(weights_only=False)`; these replace both (see
train/sharded.py). And writing one so that a full disk says so (`WriteErrorWriter`). Apart from sharded.py
so that importing it, which the pre-flight check does, does not import torch.distributed.checkpoint (a
second)."""

from __future__ import annotations

import io
import pickle
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..errors import RecordError, first_line
from .damage import damaged, weights_only_refusal

# What DCP's .metadata pickles, and nothing else: its own dataclasses, torch's sizes, dtypes and layouts,
# and the checkpoint's path. Each is a constructor or a lookup; none runs code it is given.
METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "StorageMeta", "MetadataIndex", "TensorProperties",
                                              "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata, refusing any global that METADATA_GLOBALS (or a torch dtype) does not name."""

    def find_class(self, module: str, name: str):
        if name in METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}: not part of a checkpoint's metadata")


class SafeMetadataReader(FileSystemReader):
    """torch's FileSystemReader, but its metadata is read by MetadataUnpickler (torch reads it with plain
    `pickle.load`); what it does after reading is torch's."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            data = stream.read()
        try:
            metadata = MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as e:  # noqa: BLE001 - a refused global, or whatever a damaged pickle raises
            raise damaged(Path(self.path), f"{Path(path).name}: {type(e).__name__}: {first_line(e)}") from None
        if not isinstance(metadata, Metadata):
            raise damaged(Path(self.path), f"{Path(path).name} holds a {type(metadata).__name__}, not DCP's Metadata")
        for info in (metadata.storage_data or {}).values():  # DCP reads these files: only the checkpoint's own
            name = getattr(info, "relative_path", None)
            if not isinstance(name, str) or Path(name).name != name or not (Path(self.path) / name).is_file():
                raise damaged(Path(self.path), f"{Path(path).name} names a file outside it: {name!r}")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but the non-tensor values (saved with torch.save) are read by the
    weights-only loader (DefaultLoadPlanner.load_bytes reads them with weights_only=False)."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise RecordError(f"a value of the sharded checkpoint ({read_item.dest_index.fqn}) was refused by "
                              f"the weights-only loader ({weights_only_refusal(e)}); resume=false starts over") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _KeepWriteError:
    """A file DCP writes through, keeping the OSError of a failed write in `errors` (see WriteErrorWriter);
    everything else is the file's."""

    def __init__(self, file, path, errors: list):
        self._file, self._path, self._errors = file, path, errors

    def _kept(self, call, *args):
        try:
            return call(*args)
        except OSError as e:
            self._errors.append(OSError(e.errno, e.strerror, str(self._path)))
            raise

    def write(self, data) -> int:
        return self._kept(self._file.write, data)

    def flush(self) -> None:
        self._kept(self._file.flush)

    def close(self) -> None:
        self._kept(self._file.close)

    def __getattr__(self, name):
        return getattr(self._file, name)


class _KeepingFileSystem(FileSystem):
    def __init__(self):
        super().__init__()
        self.errors: list[OSError] = []

    @contextmanager
    def create_stream(self, path, mode):
        with super().create_stream(path, mode) as stream:
            yield _KeepWriteError(stream, path, self.errors) if "w" in mode else stream


class WriteErrorWriter(FileSystemWriter):
    """torch's FileSystemWriter, but a write that fails for want of space (or any OSError) raises that
    OSError, naming the file: DCP writes each tensor with torch.save, whose zip writer turns it into a
    RuntimeError about stream positions ("unexpected pos 704 vs 598"), which says nothing of a full disk."""

    def __init__(self, path: str):
        super().__init__(path)
        self.fs = _KeepingFileSystem()

    def write_data(self, plan, planner):
        try:
            return super().write_data(plan, planner)
        except OSError:
            raise
        except Exception:
            if self.fs.errors:
                raise self.fs.errors[0] from None
            raise
