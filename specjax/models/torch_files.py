"""Tensor files without torch: safetensors and torch.save's zip files (``.pt``, ``.bin``) as numpy.

A torch file is a zip holding a pickle (``<root>/data.pkl``) and one raw entry per storage
(``<root>/data/<key>``). A pickle can run any code its globals name, so the unpickler here
resolves only the names a state dict needs (``collections.OrderedDict``, torch's tensor and
parameter rebuild functions, its typed storage classes and dtypes) to inert stand-ins, and
refuses every other one before anything runs. Storages are read from the zip lazily, once each
(tensors that share one are views of it), and every view is checked to lie inside its storage.
``read_shapes`` stops before the storages: names, shapes and dtypes from the header alone.

``write_safetensors`` and ``write_torch`` write the same two formats (``write_torch``: what
``torch.load(weights_only=True)`` reads), each into a file of its own.
"""

import collections
import dataclasses
import io
import json
import math
import pickle
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

TORCH_SUFFIXES = (".pt", ".pth", ".bin")


class TensorFileError(ValueError):
  """A tensor file that cannot be read; the message names the file and the fix."""


# --- dtypes --------------------------------------------------------------------------------------

_BF16 = np.dtype(ml_dtypes.bfloat16)
# safetensors' dtype names and torch's typed storage classes, as numpy dtypes.
_ST_DTYPES = {
  "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
  "BF16": _BF16, "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}  # fmt: skip
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_STORAGES = {
  "DoubleStorage": "F64", "FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16",
  "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
  "ByteStorage": "U8", "BoolStorage": "BOOL",
}  # fmt: skip
_STORAGE_OF = {v: k for k, v in _STORAGES.items()}
_TORCH_DTYPES = {
  "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
  "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip


# --- reading -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Info:
  """A tensor's shape and dtype, from a file's header."""

  shape: tuple[int, ...]
  dtype: np.dtype


def read_tensors(path) -> dict[str, np.ndarray]:
  """Every tensor of a ``.safetensors`` or torch ``.pt``/``.bin`` file, as numpy arrays
  (bfloat16 as ``ml_dtypes.bfloat16``); a missing, damaged or unsafe file is one error."""
  return _read(Path(path), data=True)


def read_shapes(path) -> dict[str, Info]:
  """Every tensor's shape and dtype, from the file's header only (no tensor data is read)."""
  return _read(Path(path), data=False)


def _read(path: Path, data: bool):
  if not path.is_file():
    raise TensorFileError(f"{path} does not exist: copy or download it again.")
  try:
    if path.suffix == ".safetensors":
      return _read_safetensors(path, data)
    return _read_torch(path, data)
  except TensorFileError:
    raise
  except Exception as e:  # noqa: BLE001 - a damaged file fails anywhere in zip or pickle
    raise TensorFileError(
      f"{path} is damaged or truncated ({type(e).__name__}: {e}): download or copy it again."
    ) from None


def safetensors_layout(path) -> tuple[dict[str, Info], dict[str, tuple[int, int]], int]:
  """A ``.safetensors`` file's header, checked against the file: each tensor's ``Info``, its
  byte span ``[begin, end)`` in the data, and the offset where the data starts."""
  path = Path(path)
  if not path.is_file():
    raise TensorFileError(f"{path} does not exist: copy or download it again.")
  size = path.stat().st_size
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise TensorFileError(f"{path} is truncated ({size} bytes): download or copy it again.")
    (n,) = struct.unpack("<Q", head)
    if 8 + n > size:
      raise TensorFileError(
        f"{path} is truncated (its header claims {n} bytes, the file has {size}): download "
        "or copy it again."
      )
    try:
      header = json.loads(f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise TensorFileError(
        f"{path} is damaged (its header is not JSON: {e}): download or copy it again."
      ) from None
  header.pop("__metadata__", None)
  body = size - 8 - n
  infos, spans = {}, {}
  for name, t in header.items():
    if t["dtype"] not in _ST_DTYPES:
      raise TensorFileError(
        f"{path}: tensor {name!r} has dtype {t['dtype']}, which specjax does not read; "
        f"save it as one of {', '.join(_ST_DTYPES)}."
      )
    dtype, shape = _ST_DTYPES[t["dtype"]], tuple(int(s) for s in t["shape"])
    begin, end = (int(o) for o in t["data_offsets"])
    if end - begin != math.prod(shape) * dtype.itemsize or not 0 <= begin <= end <= body:
      raise TensorFileError(
        f"{path} is damaged or truncated: tensor {name!r} {list(shape)} {t['dtype']} claims "
        f"bytes [{begin}, {end}) of a {body}-byte body; download or copy it again."
      )
    infos[name], spans[name] = Info(shape, dtype), (begin, end)
  if max((e for _, e in spans.values()), default=0) != body:
    raise TensorFileError(
      f"{path} is damaged or truncated: its tensors end at byte "
      f"{max((e for _, e in spans.values()), default=0)} of a {body}-byte body; download or "
      "copy it again."
    )
  return infos, spans, 8 + n


def read_safetensor(f, start: int, span: tuple[int, int], info: Info) -> np.ndarray:
  """One tensor of an open ``.safetensors`` file (``safetensors_layout``'s start, span and
  info), read into a fresh array: a plain read, so no page of the file stays resident."""
  out = np.empty(info.shape, info.dtype)
  f.seek(start + span[0])
  if f.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
    raise TensorFileError(f"{f.name} is truncated: download or copy it again.")
  return out


def _read_safetensors(path: Path, data: bool):
  infos, spans, start = safetensors_layout(path)
  if not data:
    return infos
  with open(path, "rb") as f:
    return {name: read_safetensor(f, start, spans[name], infos[name]) for name in infos}


@dataclasses.dataclass(frozen=True)
class _Storage:
  key: str
  kind: str  # a safetensors dtype name
  numel: int


@dataclasses.dataclass(frozen=True)
class _Tensor:
  storage: _Storage
  offset: int
  shape: tuple[int, ...]
  stride: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Marker:
  """What an allowed torch global unpickles to: a name, never code."""

  name: str


def _rebuild_tensor(storage, offset, shape, stride, requires_grad=False, hooks=None, meta=None):
  if not isinstance(storage, _Storage):
    raise TensorFileError(f"a tensor's storage is {type(storage).__name__}, not a storage")
  return _Tensor(storage, int(offset), tuple(int(s) for s in shape), tuple(int(s) for s in stride))


def _rebuild_parameter(data, requires_grad=False, hooks=None):
  return data


_ALLOWED = {
  ("collections", "OrderedDict"): collections.OrderedDict,
  ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
  ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
} | {("torch", n): _Marker(n) for n in list(_STORAGES) + list(_TORCH_DTYPES)}


class _Unpickler(pickle.Unpickler):
  """Resolves only the globals of a state dict; storages come back as ``_Storage`` records."""

  def __init__(self, file, path: Path):
    super().__init__(file)
    self.path = path

  def find_class(self, module, name):
    if (module, name) not in _ALLOWED:
      raise TensorFileError(
        f"{self.path}: its pickle asks for {module}.{name}, which a file of tensors does not "
        "need; refusing to load it (unpickling can run code). Load it with torch only if you "
        "trust its source, and save the tensors as safetensors (safetensors.torch.save_file)."
      )
    return _ALLOWED[(module, name)]

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
      raise TensorFileError(f"{self.path}: unknown persistent id {pid!r} in its pickle.")
    _, kind, key, _, numel = pid
    if not (isinstance(kind, _Marker) and kind.name in _STORAGES):
      raise TensorFileError(f"{self.path}: storage type {kind!r} is not a typed torch storage.")
    return _Storage(str(key), _STORAGES[kind.name], int(numel))


def _read_torch(path: Path, data: bool):
  with open(path, "rb") as f:
    magic = f.read(4)
  if magic[:2] != b"PK":
    if magic[:1] == b"\x80":
      raise TensorFileError(
        f"{path} is in torch's legacy (pre-1.6) format, which specjax does not read: save it "
        "again with torch.save (torch >= 1.6) or as safetensors."
      )
    raise TensorFileError(
      f"{path} is neither a safetensors nor a torch zip file (it starts with {magic!r}): "
      "download or copy it again."
    )
  with zipfile.ZipFile(path) as z:
    pkls = [n for n in z.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
      raise TensorFileError(f"{path} holds no data.pkl: it is not a file torch.save wrote.")
    root = pkls[0][: -len("data.pkl")]
    big = root + "byteorder" in z.namelist() and z.read(root + "byteorder").strip() == b"big"
    obj = _Unpickler(io.BytesIO(z.read(pkls[0])), path).load()
    if not isinstance(obj, dict) or not all(
      isinstance(k, str) and isinstance(v, _Tensor) for k, v in obj.items()
    ):
      raise TensorFileError(
        f"{path} does not hold a flat state dict (names to tensors): save the module's "
        "state_dict() itself."
      )
    if not data:
      return {k: Info(t.shape, _ST_DTYPES[t.storage.kind]) for k, t in obj.items()}
    storages: dict[str, np.ndarray] = {}
    out = {}
    for name, t in obj.items():
      s = t.storage
      if s.key not in storages:
        dtype = _ST_DTYPES[s.kind].newbyteorder(">") if big else _ST_DTYPES[s.kind]
        raw = z.read(f"{root}data/{s.key}")
        if len(raw) != s.numel * dtype.itemsize:
          raise TensorFileError(
            f"{path} is damaged: storage {s.key} has {len(raw)} bytes, not "
            f"{s.numel} x {dtype.itemsize}; download or copy it again."
          )
        storages[s.key] = np.frombuffer(raw, dtype).astype(_ST_DTYPES[s.kind], copy=False)
      out[name] = _view(storages[s.key], t, name, path)
    return out


def _view(storage: np.ndarray, t: _Tensor, name: str, path: Path) -> np.ndarray:
  """The tensor ``t`` as a copy of its strided view into ``storage``."""
  if len(t.shape) != len(t.stride) or min(t.shape + t.stride + (t.offset,), default=0) < 0:
    raise TensorFileError(f"{path}: tensor {name!r} has a malformed shape/stride.")
  if math.prod(t.shape) == 0:
    return np.zeros(t.shape, storage.dtype)
  last = t.offset + sum((n - 1) * s for n, s in zip(t.shape, t.stride, strict=True))
  if last >= storage.size:
    raise TensorFileError(
      f"{path} is damaged: tensor {name!r} reaches element {last} of a {storage.size}-element "
      "storage; download or copy it again."
    )
  step = storage.dtype.itemsize
  view = np.lib.stride_tricks.as_strided(
    storage[t.offset :], t.shape, tuple(s * step for s in t.stride), writeable=False
  )
  return np.array(view)


# --- writing -------------------------------------------------------------------------------------


def _host(tensors: dict) -> dict[str, np.ndarray]:
  out = {}
  for name, v in tensors.items():
    a = np.array(v, order="C", copy=None)  # (np.ascontiguousarray makes a scalar 1-d)
    if a.dtype not in _ST_NAMES:
      raise TypeError(f"tensor {name!r}: dtype {a.dtype} cannot be written.")
    out[name] = a
  return out


def write_safetensors(path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
  """Writes ``tensors`` (numpy/JAX arrays, bfloat16 included) as one safetensors file."""
  tensors = _host(tensors)
  header, offset = {}, 0
  for name, a in tensors.items():
    span = [offset, offset + a.nbytes]
    header[name] = {"dtype": _ST_NAMES[a.dtype], "shape": list(a.shape), "data_offsets": span}
    offset += a.nbytes
  if metadata:
    header["__metadata__"] = metadata
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for a in tensors.values():
      f.write(a.tobytes())


def write_torch(path, tensors: dict) -> None:
  """Writes ``tensors`` as ``torch.save`` writes a state dict (an ``OrderedDict`` of tensors, one
  storage each, in torch's zip layout), so ``torch.load(path, weights_only=True)`` reads it."""
  tensors = _host(tensors)
  root = Path(path).stem or "archive"
  with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
    z.writestr(f"{root}/data.pkl", _state_dict_pickle(tensors))
    z.writestr(f"{root}/byteorder", "little")
    for i, a in enumerate(tensors.values()):
      z.writestr(f"{root}/data/{i}", a.tobytes())
    z.writestr(f"{root}/version", "3\n")


def _state_dict_pickle(tensors: dict[str, np.ndarray]) -> bytes:
  """Protocol-2 pickle of an OrderedDict of ``torch._utils._rebuild_tensor_v2`` calls, written
  opcode by opcode (pickling torch's own objects would need torch)."""
  p = pickle
  text = lambda s: p.BINUNICODE + struct.pack("<I", len(s.encode())) + s.encode()  # noqa: E731
  glob = lambda m, n: p.GLOBAL + f"{m}\n{n}\n".encode()  # noqa: E731

  def integer(n: int) -> bytes:
    if 0 <= n < 2**31:
      return p.BININT + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return p.LONG1 + bytes([len(raw)]) + raw

  ints = lambda xs: p.MARK + b"".join(integer(x) for x in xs) + p.TUPLE  # noqa: E731
  empty_dict = glob("collections", "OrderedDict") + p.EMPTY_TUPLE + p.REDUCE
  out = [p.PROTO + b"\x02", empty_dict, p.MARK]
  for i, (name, a) in enumerate(tensors.items()):
    stride = [int(s // a.itemsize) for s in a.strides] if a.ndim else []
    storage = glob("torch", _STORAGE_OF[_ST_NAMES[a.dtype]])
    pid = p.MARK + text("storage") + storage + text(str(i)) + text("cpu") + integer(a.size)
    out += [text(name), glob("torch._utils", "_rebuild_tensor_v2"), p.MARK]
    out += [pid + p.TUPLE + p.BINPERSID, integer(0), ints(a.shape), ints(stride)]
    out += [p.NEWFALSE, empty_dict, p.TUPLE, p.REDUCE]
  out += [p.SETITEMS, p.STOP]
  return b"".join(out)
