"""The pickle half of the torch reader (convert/torch_pt.py): load a checkpoint's data.pkl without running or
trusting anything in it.

  1. `_scan` walks the pickle's opcodes without building anything and refuses what would hurt the unpickler
     itself: memo indices far beyond the pickle's size (CPython sizes its memo table by the largest index),
     dict keys or set members that are not plain scalars (hashing a tuple nested a million deep overflows the C
     stack; a DAG of shared tuples takes forever to hash), and more opcodes than any checkpoint needs.
  2. `_RestrictedUnpickler` resolves only the globals needed to rebuild tensors, each to an object of ours
     (never an imported one), and refuses every other name before anything is called. Everything it hands to
     the pickle is read-only: BUILD (which would set attributes) is refused on our records, and the dict that
     stands for OrderedDict drops the attribute dict torch attaches to state dicts (`_metadata`). A tensor comes
     out as an inert TensorRecord of type- and range-checked plain values; torch_pt checks it against the archive
     and only then makes a SourceTensor from it.

Messages describe the problem with checked numbers and type names only: nothing from the pickle is repr()'d (a
1 KB DAG of shared tuples has a repr of many GB).
"""
from __future__ import annotations

import io
import pickle
import pickletools
import re
from typing import Any

# torch storage class name -> dtype (safetensors spelling)
STORAGE_TYPES = {
    "DoubleStorage": "F64", "FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16",
    "LongStorage": "I64", "IntStorage": "I32", "ShortStorage": "I16", "CharStorage": "I8",
    "ByteStorage": "U8", "BoolStorage": "BOOL",
}
_MAX_OPCODES = 1 << 20  # ~25-35 opcodes per tensor: room for 30k tensors in one file (shards hold far fewer)
_MAX_DIMS = 64  # torch's own limit on tensor dimensions
_MAX_COUNT = 1 << 62  # sizes, strides, offsets and element counts (also keeps int -> str cheap)
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,200}")  # storage keys: torch writes "0", "1", ...


class Refused(Exception):
    """The pickle is hostile or malformed; the message is short and built from checked values only."""


def clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def describe(e: BaseException) -> str:
    """`Type: message` of an exception raised on untrusted input, without formatting its arguments (str() of
    a KeyError is the repr of its key, which may be a huge object)."""
    arg = e.strerror if isinstance(e, OSError) and e.strerror else e.args[0] if e.args else None
    return f"{type(e).__name__}: {clip(arg, 160)}" if type(arg) is str else type(e).__name__


def load_pickle(data: bytes) -> Any:
    """Scan, then unpickle with the restricted unpickler. Raises Refused, or what pickle/pickletools raise on
    malformed data (UnpicklingError, ValueError, ...)."""
    _scan(data)
    return _RestrictedUnpickler(io.BytesIO(data)).load()


# ---- step 1: opcode scan -----------------------------------------------------------------------------------

_SCALAR_OPS = frozenset(
    "INT BININT BININT1 BININT2 LONG LONG1 LONG4 STRING BINSTRING SHORT_BINSTRING UNICODE SHORT_BINUNICODE "
    "BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 NONE NEWTRUE NEWFALSE FLOAT BINFLOAT".split())
_KEYED = {"SETITEMS": 2, "DICT": 2, "ADDITEMS": 1, "FROZENSET": 1}  # opcode -> step between hashed items


def _scan(data: bytes) -> None:
    """Simulate the unpickler's stack with one flag per slot (is it a scalar: str/bytes/int/float/bool/None,
    hashable without recursion) and refuse what the C unpickler would choke on (see the module docstring).
    Raises Refused, or UnpicklingError / ValueError (from pickletools) for malformed pickles."""
    stack: list[bool] = []
    marks: list[int] = []  # stack heights at each MARK
    memo: dict[int, bool] = {}

    def pop(n: int) -> list[bool]:
        if len(stack) - (marks[-1] if marks else 0) < n:
            raise pickle.UnpicklingError("stack underflow")
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def pop_mark() -> list[bool]:
        if not marks:
            raise pickle.UnpicklingError("could not find MARK")
        items = stack[marks[-1]:]
        del stack[marks.pop():]
        return items

    for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
        if count >= _MAX_OPCODES:
            raise Refused(f"the pickle has more than {_MAX_OPCODES} opcodes")
        name = op.name
        if name in ("GLOBAL", "INST"):  # refused names are refused here already, before anything is built
            _resolve(*arg.split(" ", 1))
        if name == "MARK":
            marks.append(len(stack))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
            index = len(memo) if name == "MEMOIZE" else arg
            if not 0 <= index <= len(data):
                raise Refused(f"the pickle stores into memo slot {index} (its size allows {len(data)})")
            memo[index] = pop(1)[0]
            stack.append(memo[index])
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in memo:
                raise pickle.UnpicklingError("it reads an empty memo slot")
            stack.append(memo[arg])
        elif name == "DUP":
            stack.extend(pop(1) * 2)
        elif name == "POP" and marks and marks[-1] == len(stack):
            marks.pop()  # what CPython does for POP right after MARK
        elif name == "SETITEM":
            if not pop(2)[0]:
                raise Refused("the pickle uses a dict key that is not a string or number")
        elif name in _KEYED:
            if not all(pop_mark()[::_KEYED[name]]):
                raise Refused("the pickle uses a dict key or set member that is not a string or number")
            if name in ("DICT", "FROZENSET"):
                stack.append(False)
        elif name == "STOP":
            return
        else:  # every other opcode by its declared stack effect (GLOBAL and INST included)
            before = op.stack_before
            if pickletools.markobject in before:
                pop_mark()
                pop(before.index(pickletools.markobject))
            else:
                pop(len(before))
            stack.extend([name in _SCALAR_OPS] * len(op.stack_after))


# ---- step 2: the restricted unpickler and its read-only records --------------------------------------------

class _Frozen:
    """Base of every object the unpickler hands to the pickle. BUILD calls __setstate__ when there is one
    (instead of writing __dict__ or slots), so refusing here keeps these objects as we made them."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise Refused("the pickle tries to modify a tensor record (BUILD on a torch object)")


class StorageType(_Frozen):
    """What `torch.<T>Storage` resolves to: a marker carrying the dtype; not callable."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: str):
        self.dtype = dtype


class StorageRecord(_Frozen):
    """A storage named by a persistent id; its bytes are the zip member `data/<key>`."""

    __slots__ = ("key", "dtype", "numel")

    def __init__(self, key: str, dtype: str, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


class TensorRecord(_Frozen):
    """A tensor as the pickle describes it, checked for types and ranges; checked against the archive and
    turned into a SourceTensor only after load (`_Archive.tensor`)."""

    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage: StorageRecord, offset: int, size: tuple[int, ...], stride: tuple[int, ...]):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class _Global(_Frozen):
    """An allow-listed global: calling it calls our function."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


class StateDict(dict):
    """What `collections.OrderedDict` builds. torch attaches `_metadata` (module versions) to state dicts with
    BUILD; it is dropped here, and it is the only state BUILD may give."""

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        if type(state) is not dict:
            raise Refused("the pickle gives a dict attribute state that is not a dict")


def _count(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v < _MAX_COUNT:
        raise Refused(f"malformed tensor record: {what} is not a count ({type(v).__name__})")
    return v


def _dims(v: Any, what: str) -> tuple[int, ...]:
    if type(v) not in (tuple, list) or len(v) > _MAX_DIMS:
        raise Refused(f"malformed tensor record: {what} is not a tuple of at most {_MAX_DIMS} counts")
    return tuple(_count(x, what) for x in v)


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored) -> TensorRecord:
    """(storage, offset, size, stride, [requires_grad, hooks, metadata]) -> an inert TensorRecord."""
    if type(storage) is not StorageRecord:
        raise Refused(f"malformed tensor record: its storage is a {type(storage).__name__}")
    size, stride = _dims(size, "size"), _dims(stride, "stride")
    if len(size) != len(stride):
        raise Refused(f"malformed tensor record: {len(size)} sizes but {len(stride)} strides")
    return TensorRecord(storage, _count(storage_offset, "storage offset"), size, stride)


def _rebuild_parameter(data, *_ignored) -> TensorRecord:
    if type(data) is not TensorRecord:
        raise Refused(f"malformed parameter record: its data is a {type(data).__name__}")
    return data  # an nn.Parameter is its tensor for our purposes


def _ordered_dict(*args) -> StateDict:
    if args:
        raise Refused("the pickle builds an OrderedDict from arguments (torch fills it item by item)")
    return StateDict()


_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor, ("torch._utils", "_rebuild_tensor"):
            _rebuild_tensor, ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
            ("collections", "OrderedDict"): _ordered_dict}


def _resolve(module: str, name: str = "") -> Any:
    """An allow-listed global as an object of ours; any other name is refused."""
    fn = _GLOBALS.get((module, name))
    if fn is not None:
        return _Global(fn)
    if module == "torch" and name in STORAGE_TYPES:
        return StorageType(STORAGE_TYPES[name])
    raise Refused(f"the pickle names {clip(str(module))}.{clip(str(name))}, which is not needed to rebuild "
                  "tensors (the file may contain code); nothing was run")


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _resolve(module, name)

    def persistent_load(self, pid: Any) -> StorageRecord:
        if (type(pid) is not tuple or len(pid) != 5 or type(pid[0]) is not str or pid[0] != "storage"
                or type(pid[1]) is not StorageType
                or type(pid[2]) is not str or not _KEY.fullmatch(pid[2])):
            raise Refused(f"unexpected persistent id in the pickle (a {type(pid).__name__}, expected "
                          "('storage', torch.<T>Storage, key, location, numel))")
        return StorageRecord(pid[2], pid[1].dtype, _count(pid[4], "storage size"))


def kind(obj: Any) -> str:
    """What an object the pickle built is, for messages (a type name, never its value)."""
    names = {StorageRecord: "storage outside a tensor", StorageType: "storage type", _Global: "function reference"}
    return names.get(type(obj), type(obj).__name__)
