"""Measurements of one step: norms and what a batch looks like, without a device sync."""

from __future__ import annotations

import datetime
import enum
import math
import numbers
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from tuiwatch.publisher.deferred import defer, number
from tuiwatch.publisher.late_probes import HELD_BYTES, LateProbes
from tuiwatch.publisher.nested import fields_of, is_graph_data, numpy_kind

_WIDE_FLOATS = (torch.float32, torch.float64)
# What a batch holds beside its tensors and holds none: a sample's file name, size or scale.
_LEAVES = frozenset((str, bytes, int, float, bool, type(None)))
# What a part of a batch not looked into may be and hold no NaN: a sample's number, label, file, time or id.
_NO_FLOATS = (
    numbers.Number,
    enum.Enum,
    os.PathLike,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    uuid.UUID,
    torch.dtype,
    torch.device,
    range,
)
# What a batch's first tensor is when it holds token ids: integers, but not uint8 (images) or bool (masks).
_TOKEN_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("int8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
    if hasattr(torch, name)
)
# Up to this many tensors, adding per-tensor norms in Python beats stack + norm on the CPU.
_PYTHON_SUM_MAX = 32
# Up to this many elements a tensor on average, one flat copy of them all and its dot with itself run fewer
# instructions than a norm a tensor, whose setup is ~7,000 instructions each: 40,900 against 65,600 for the tiny
# MLP's 4 gradients (162 elements), 69,500 against 99,100 for 6 of 5,378, 160,400 against 114,600 for the CNN's
# 6 of 25,600 (bench/instructions.py's way, docs/performance.md).
FLAT_ELEMENTS_PER_TENSOR = 2048
_flatten: Callable[[list[torch.Tensor]], torch.Tensor] | None = getattr(torch._C._nn, "flatten_dense_tensors", None)
# A flat dot's sum of squares is read only between these: float32 squares under them may have lost their digits
# (an element below ~1e-19) or overflowed (above ~1e19), and those norms are read the exact way instead.
_SQUARES = (1e-30, 1e30)


def total_norm(tensors: Sequence[torch.Tensor], flat: bool = False) -> Any:
    """The 2-norm of all ``tensors`` together: a float (CPU), a device scalar (CUDA), or None. ``flat``: they
    are such as :func:`flat_normable` takes."""
    if tensors and tensors[0].requires_grad:  # parameters: no autograd graph for a reading
        with torch.no_grad():
            return gradient_norm(tensors, flat)
    # Gradients (the every-step case): no no_grad() block, which alone cost ~10 µs a step in the loop.
    return gradient_norm(tensors, flat)


def flat_normable(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` (a model's parameters; their gradients are alike) are normed as one flat copy: few
    and small dense float tensors of one dtype, on the CPU, and plain ones: a subclass's ops are its own (FSDP's
    DTensor shards: their flat dot read the whole model's norm, through a collective, where each rank's is its
    shard's). Asked once a parameter list, not at every step."""
    if _flatten is None or not tensors or len(tensors) > _PYTHON_SUM_MAX:
        return False
    dtype = tensors[0].dtype
    return (
        dtype in _WIDE_FLOATS
        and all(
            (type(t) is torch.nn.Parameter or type(t) is torch.Tensor)
            and t.is_cpu
            and t.layout is torch.strided
            and t.dtype is dtype
            for t in tensors
        )
        and sum(t.numel() for t in tensors) <= FLAT_ELEMENTS_PER_TENSOR * len(tensors)
    )


def gradient_norm(tensors: Sequence[torch.Tensor], flat: bool = False) -> Any:
    """:func:`total_norm` of tensors that need no autograd graph (gradients: the every-step case)."""
    if not tensors:
        return None
    if flat and _flatten is not None:
        try:
            whole = _flatten(tensors if type(tensors) is list else list(tensors))
            # (A model moved to a GPU since it was asked: .item() would sync there, the way below does not.)
            squares = torch.dot(whole, whole).item() if whole.is_cpu else math.nan
        except Exception:  # a gradient unlike its parameter (a sparse one): the way below
            squares = math.nan
        if _SQUARES[0] < squares < _SQUARES[1]:
            return math.sqrt(squares)
        # Squares out of float32's good range, or a value that is not finite: read exactly (and alike) below.
    try:
        norms: tuple[torch.Tensor, ...] | list[torch.Tensor] = torch._foreach_norm(
            tensors if type(tensors) is list else list(tensors)
        )
    except RuntimeError:  # (NotImplementedError is one)
        # Sparse gradients (nn.Embedding(sparse=True)) have no fused norm (neither has clip_grad_norm_): one at a time.
        norms = [_one_norm(t) for t in tensors]
    if len(norms) <= _PYTHON_SUM_MAX and norms[0].is_cpu:
        return math.sqrt(math.fsum([n.item() ** 2 for n in norms]))
    try:
        return torch.linalg.vector_norm(torch.stack(norms))
    except RuntimeError:
        # several devices or dtypes: torch's own grouping handles them (the norm of the norms is the total norm)
        return torch.nn.utils.get_total_norm(norms, foreach=True)


def _one_norm(t: torch.Tensor) -> torch.Tensor:
    """A tensor's 2-norm, sparse ones included: a sparse gradient's duplicate indices add up first (coalesce)."""
    if t.layout is torch.sparse_coo:
        t = t.coalesce().values()
    elif t.layout is not torch.strided:
        t = t.values()  # compressed layouts (CSR and its kind) hold each element once
    norm: torch.Tensor = torch.linalg.vector_norm(t)
    return norm


def finiteness_probe(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A scalar that is finite iff every element of ``t`` is (one reduction kernel).

    The sum is taken in at least float32, which only overflows beyond ~3e38,
    far outside what activations and inputs hold; a NaN or inf anywhere makes
    it non-finite. ``dtype`` is ``t.dtype`` where the caller has read it already.
    """
    if t.requires_grad:  # an output: no graph for a reading (a batch tensor needs no detach)
        t = t.detach()
    if dtype is None:
        dtype = t.dtype
    return t.sum() if dtype is torch.float32 or dtype is torch.float64 else t.sum(dtype=torch.float32)


def first_tensor(obj: Any) -> torch.Tensor | None:
    """The first tensor in a model output or batch: a tensor, a sequence, a mapping, a dataclass, or ``.logits``."""
    if isinstance(obj, torch.Tensor):
        return obj
    values = obj.values() if isinstance(obj, Mapping) else obj if isinstance(obj, list | tuple) else ()
    if not values:
        values = (fields_of(obj) or {}).values()
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    logits = getattr(obj, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def output_tensor(output: Any) -> torch.Tensor | None:
    """The tensor of a model's output whose finiteness is the model's: itself, its logits, or its first tensor
    that is not a loss.

    A Hugging Face model given labels returns its loss first (``CausalLMOutput(loss=..., logits=...)``, or
    ``(loss, logits, ...)`` with ``return_dict=False``), and so do models of one's own that return
    ``{"loss": ..., "logits": ...}`` (or its parts by name, ``loss_cls``: :func:`_names_a_loss`). That loss is the
    chain's next link, computed inside the model: a batch whose every label is masked (a prompt-only or all-padding
    batch) gives a NaN loss (0/0) over finite logits, which is the loss's failure, not the model's. A sequence has
    no names: its first tensor with a dimension (a loss is a scalar, a model's output has its batch), else its
    first. Among them a floating one first: a policy's ``(action, logprob, entropy, value)`` (CleanRL's, Lightning
    Fabric's PPO agent) starts with the sampled actions, integers with nothing to check, and its output went
    unchecked.
    """
    kind = type(output)
    if kind is tuple or kind is list:
        scalar = other = None
        for v in output:
            if isinstance(v, torch.Tensor):
                if v.dim():
                    if v.dtype.is_floating_point:
                        return v
                    if other is None:
                        other = v
                elif scalar is None:
                    scalar = v
        return other if other is not None else scalar
    if isinstance(output, Mapping):
        named: Mapping[Any, Any] | None = output
        logits = output.get("logits")
    else:  # an output class of one's own (a dataclass: by its fields), or an object with .logits
        named = fields_of(output)
        logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if named is None:
        return first_tensor(output)
    tensors = [v for k, v in named.items() if not _names_a_loss(k) and isinstance(v, torch.Tensor)]
    return next((v for v in tensors if v.dtype.is_floating_point), tensors[0] if tensors else None)


def _names_a_loss(key: Any) -> bool:
    """Whether an output's key names a loss: ``"loss"``, and the parts of a loss that a model returns by name
    (MMEngine's ``loss_cls`` and ``loss_bbox``, TorchRL's ``loss_objective``). MMEngine sums as the loss every
    key that holds "loss"; one of them was taken for the model's output, and the loss's NaN for the model's."""
    return type(key) is str and "loss" in key.lower()


NO_BATCH = object()  # class_count's batch where the step's batch was not seen (a loop without a loader or step(batch=))


def class_count(output: Any, batch: Any = NO_BATCH) -> int | None:
    """The class count loss-chance compares with, where the output and the batch say it reliably; None otherwise.

    The width: logits named as such (a ``"logits"`` key, a ``.logits``
    attribute, as Hugging Face models return them): their last dimension,
    whatever their rank ((batch, classes), (batch, time, vocabulary)).
    Otherwise the first floating tensor of the output (itself, or the first of
    a tuple or dict that has one) when it is 2-D: (batch, classes). A 4-D map
    or a 1-D regression output says nothing.

    Where the step's batch was seen, it must hold the labels of such a
    classifier: an integer tensor with one value per row of the output
    ((batch,) for (batch, classes), (batch, time) or its flat form for
    (batch, time, vocabulary)). A regression's float targets, soft or
    multi-hot labels (their loss is not at ln C by chance) do not. A batch
    that is not seen leaves the width as the only evidence.
    """
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor) and logits.is_floating_point() and logits.dim() >= 2:
        out: torch.Tensor | None = logits
        width = int(logits.shape[-1])
    else:
        values = output.values() if isinstance(output, Mapping) else output if isinstance(output, list | tuple) else ()
        candidates = [output] if isinstance(output, torch.Tensor) else list(values)
        out = next(
            (t for t in candidates if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 1), None
        )
        width = int(out.shape[1]) if out is not None and out.dim() == 2 else 0
    if width < 2 or out is None:
        return None
    if batch is NO_BATCH:
        return width
    rows = out.numel() // width
    tensors: list[torch.Tensor] = []
    _shape_and_tensors(batch, tensors)
    labelled = any(
        not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool and t.numel() == rows
        for t in tensors
    )
    return width if labelled else None


def _shape_and_tensors(
    batch: Any,
    tensors: list[torch.Tensor],
    shape: Callable[[torch.Tensor], Any] | None = None,
    unread: list[Any] | None = None,
) -> Any:
    """The batch with each tensor replaced by its shape (``shape(t)`` where given); collects the tensors on the way,
    and into ``unread`` each part it does not look into that may hold a NaN.

    A part that holds no tensor is None, whatever it holds: an Ultralytics YOLO batch's ``im_file`` (a file name a
    sample), ``ori_shape``, ``resized_shape`` and ``ratio_pad`` were lists of nulls as long as the batch, 3.5 KB of
    every step's line at a batch of 64.
    """
    if isinstance(batch, torch.Tensor):
        tensors.append(batch)
        return list(batch.shape) if shape is None else shape(batch)
    before = len(tensors)
    if isinstance(batch, list | tuple):
        # A file name or a number a sample is None without a call: such lists cost 0.5 ms a YOLO batch of 64
        # (im_file, ori_shape, ratio_pad: ~700 calls of this function).
        parts: Any = [None if type(v) in _LEAVES else _shape_and_tensors(v, tensors, shape, unread) for v in batch]
    elif type(batch) in _LEAVES:
        return None
    elif isinstance(batch, Mapping):
        parts = {str(k): _shape_and_tensors(v, tensors, shape, unread) for k, v in batch.items()}
    else:
        named = fields_of(batch)  # a batch class of one's own (@dataclass class Batch: x, y): by its fields
        if named is None:
            if unread is not None and _may_be_nonfinite(batch):
                unread.append(batch)
            return None
        parts = {str(k): _shape_and_tensors(v, tensors, shape, unread) for k, v in named.items()}  # (HeteroData's)
    return parts if len(tensors) > before else None


def _may_be_nonfinite(part: Any) -> bool:
    """Whether a part of a batch the walk does not look into may hold NaN/inf: anything but a number, an enum, a
    path, a date or time, an id, a dtype or device, or a numpy array of integers, booleans, text or dates (so: a
    numpy array of floats, which _numpy_floats then sums; a DGL graph, an object of one's own, which a batch with
    such a part leaves unread: it is not called finite from its tensors alone)."""
    if isinstance(part, _NO_FLOATS):  # (numpy's scalars are numbers: as a float is, not read)
        return False
    try:
        kind = getattr(getattr(part, "dtype", None), "kind", None)
    except Exception:  # an object that raises on an attribute it lacks (a proxy): what it holds is not known
        return True
    return kind not in ("b", "i", "u", "U", "S", "M", "m")


def _numpy_floats(parts: list[Any]) -> tuple[float | None, int, bool]:
    """The sum of the parts that are numpy arrays of real floats (numpy's own, in float64: a NaN or inf anywhere makes
    it non-finite), a collate's output left as numpy, and their bytes; and whether a part is left that no sum read."""
    total: float | None = None
    nbytes = 0
    left = False
    for part in parts:
        try:
            if numpy_kind(part) == "f":
                value = float(part.sum(dtype="float64"))
                total = value if total is None else total + value
                nbytes += int(part.nbytes)
                continue
        except Exception:  # noqa: S110 - an array numpy cannot sum: not read
            pass
        left = True
    return total, nbytes, left


def batch_size(batch: Any) -> int | None:
    """How many samples ``batch`` holds, as a step record's ``examples_per_s`` counts them (:class:`BatchInfo`):
    the first dimension of its first tensor, or the count of a first part of one tensor a sample; None where it
    cannot say (a nested tensor of ragged parts has no shape to read)."""
    try:
        samples = _sample_count(batch) if isinstance(batch, list | tuple) else None
        if samples is not None:
            return samples
        if is_graph_data(type(batch)):
            return graph_samples(batch)
        first = first_tensor(batch)
        return int(first.shape[0]) if first is not None and first.dim() else None
    except Exception:  # never the training's failure: its size is not known
        return None


def _sample_count(batch: list[Any] | tuple[Any, ...]) -> int | None:
    """The sample count of a list or tuple batch whose first tensor's first dimension is not it (a first part of
    one tensor a sample, or the samples themselves), or None."""
    count = _first_part_count(batch)
    return count if count is not None else _listed_samples(batch)


def _first_part_count(batch: list[Any] | tuple[Any, ...]) -> int | None:
    """The sample count of a batch whose first part is a sequence of one tensor a sample, or None.

    torchvision's detection references collate with ``tuple(zip(*batch))``: (images, targets), a tuple of
    (3, H, W) images and one of dicts. The first tensor's first dimension, the batch's size elsewhere, is an
    image's channels there, and the example rate was 3 where it was 4 a step. Taken only where every other part
    agrees (a sequence of as many, or a tensor with as many rows): a siamese ``((x1, x2), y)`` is two inputs of
    ``len(y)`` samples each, not two samples. And only where its tensors are alike (one rank, one dtype): a
    batch left as a list of samples (``collate_fn=lambda b: b``) starts with a sample's ``(x, y)``, whose parts
    are not. A multi-task ``((x1, x2), (y1, y2))`` agrees in length, but its targets have the inputs' rows: two
    inputs again.
    """
    first = batch[0] if len(batch) > 1 else None  # (one part alone says nothing of what its tensors are)
    if not isinstance(first, list | tuple) or not first or not _all_tensors(first):
        return None
    kind = (first[0].dim(), first[0].dtype)
    if not kind[0] or any((t.dim(), t.dtype) != kind for t in first):
        return None
    n = len(first)
    rows = {int(t.shape[0]) for t in first}
    for part in batch[1:]:
        if isinstance(part, torch.Tensor):
            if not part.dim() or part.shape[0] != n:
                return None
        elif not isinstance(part, list | tuple) or len(part) != n:
            return None
        elif len(rows) == 1 and _all_tensors(part) and all(t.dim() and t.shape[0] in rows for t in part):
            return None  # (each of its tensors has the rows the first part's have: batches, not samples)
    return n


def _listed_samples(batch: Any) -> int | None:
    """The sample count of a batch left as the list of its samples (``collate_fn=lambda b: b``): a list of tuples of
    one length, or of dicts of one set of keys. torch's collate never makes one (a sample's tuple becomes a list of
    batched parts, its dict a dict), and the first tensor's first dimension there was a sample's own (an image's 3
    channels)."""
    if type(batch) is not list or len(batch) < 2:
        return None
    first = batch[0]
    kind = type(first)
    if kind is tuple:
        size = len(first)
        if all(type(e) is tuple and len(e) == size for e in batch):
            return len(batch)
    elif kind is dict:
        keys = first.keys()
        if all(type(e) is dict and e.keys() == keys for e in batch):
            return len(batch)
    return None


def graph_samples(batch: Any) -> int | None:
    """The samples of a PyTorch Geometric batch: a ``Batch``'s graphs, or a neighbour loader's seed nodes (its
    ``batch_size`` both); None for a graph alone. Not its first tensor's rows: those are nodes, or an
    ``edge_index``'s two."""
    size = getattr(batch, "batch_size", None)
    return size if type(size) is int else None


def _all_tensors(values: list[Any] | tuple[Any, ...]) -> bool:
    for v in values:  # noqa: SIM110 - a loop: all() over a generator is slower on this path
        if type(v) is not torch.Tensor:
            return False
    return True


class BatchInfo:
    """What the step record says about a batch, measured without a sync.

    Runs on the training thread between the model's kernels, where every call
    into torch is a cold one: each tensor's dtype is read once and serves the
    probe and the token count, and the size comes from the shapes already
    read (1-3 µs a batch less than asking each tensor again).
    """

    __slots__ = (
        "__weakref__",
        "finite_probe",
        "held",
        "nbytes",
        "overwritten",
        "seen",
        "shape",
        "size",
        "tokens",
        "unread",
    )
    shape: Any  # the step record's batch_shape: a list, a dict by name, or None, as the batch is

    def __init__(self, batch: Any, late: LateProbes | None = None):
        # Large CPU tensors whose finiteness the publisher thread reads (late_probes.py), and whether a loader wrote
        # another batch into their memory, or the loop changed them, before it did.
        self.held: list[torch.Tensor] | None = None
        self.overwritten = False
        # A part not looked into that may hold a NaN (_may_be_nonfinite): a finite sum of the tensors is not the
        # batch's. Until 2026-12-07 a DGL graph's features beside its labels read finite, and their NaN the model's.
        self.unread = False
        try:
            kind = type(batch)
            mapping = graph = False
            samples = arrays = None
            array_bytes = 0
            tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]
            if (kind is tuple or kind is list) and _all_tensors(batch):
                tensors = batch  # the usual (inputs, targets): no walk (~4 µs of an 11 µs probe)
                self.shape = shapes = [list(t.shape) for t in tensors]
            else:
                tensors = []
                unread: list[Any] = []
                self.shape = _shape_and_tensors(batch, tensors, None, unread)
                if unread:
                    arrays, array_bytes, self.unread = _numpy_floats(unread)
                shapes = [list(t.shape) for t in tensors[:1]]
                mapping = isinstance(batch, Mapping)
                if kind is tuple or kind is list:
                    samples = _sample_count(batch)
                elif kind is not torch.Tensor and not mapping and is_graph_data(kind):
                    graph = True  # its size is its own (graph_samples), and its integer tensors are no tokens
                    samples = graph_samples(batch)
            nbytes = 0
            probe: Any = None
            first_dtype = None
            for t in tensors:
                size = t.nbytes
                nbytes += size
                dtype = t.dtype
                if first_dtype is None:
                    first_dtype = dtype
                if dtype.is_floating_point:
                    if size >= HELD_BYTES and late is not None and late.on and t.is_cpu and late.hold(t, self):
                        if self.held is None:
                            self.held = []
                        self.held.append(t)
                        continue
                    value = finiteness_probe(t, dtype)
                    probe = value if probe is None else probe + value
            self.nbytes = nbytes + array_bytes
            # No tensor found (a batch object of a kind not walked): its finiteness is not known, not "finite".
            self.seen = bool(tensors)
            if arrays is not None:  # numpy arrays of floats beside (or instead of) the tensors, already summed
                self.seen = True
                probe = arrays if probe is None else probe + arrays
            self.finite_probe: Any = None if probe is None else probe if type(probe) is float else defer(probe)
            shape = shapes[0] if shapes and not graph else []
            self.size: int | None = samples if samples is not None else shape[0] if shape else None
            self.tokens: Any = None
            mask = batch.get("attention_mask") if mapping else None
            if isinstance(mask, torch.Tensor):
                self.tokens = defer(mask.sum())
            elif len(shape) >= 2 and first_dtype in _TOKEN_DTYPES:
                # Token ids first ((batch, time) integers, as a language model's batch starts): no mask, no padding.
                # Not bytes: timm's loader collates images as uint8 (N, 3, H, W), which are no tokens.
                self.tokens = math.prod(shape)
        except Exception:  # a layout the usual path cannot read: never the training's failure
            self._read_tolerantly(batch)

    def probe(self) -> Any:
        """The batch's finiteness probe as a number, its held tensors summed now (on the publisher thread, or where
        a failing step is examined); None where nothing was probed, a held tensor was changed first, or the sum is
        finite and a part was not read (a NaN found is one all the same)."""
        held, self.held = self.held, None
        value = number(self.finite_probe)
        if held is not None:
            try:
                for t in held:
                    v = finiteness_probe(t).item()
                    value = v if value is None else value + v
            except Exception:  # never the record's failure: this batch's finiteness is not known
                value = None
            if self.overwritten:  # (read after the sums: a loader may write while they run)
                value = None
            self.finite_probe = value
        if self.unread and value is not None and math.isfinite(value):
            return None
        return value

    def _read_tolerantly(self, batch: Any) -> None:
        """Each fact of each tensor on its own, None (or 0 bytes) where a tensor cannot say: a sparse COO tensor
        has no ``nbytes``, a nested tensor of ragged parts no shape and no sum (GCN's sparse features, a model fed
        nested tensors). Rare, so slow."""
        self.held = None  # what the usual path held before it failed is probed here, at once
        tensors: list[torch.Tensor] = []
        unread: list[Any] = []
        try:
            self.shape = _shape_and_tensors(batch, tensors, _shape_or_none, unread)
        except Exception:  # a part that raises when it is looked into (a property, a proxy): none of it is known
            self.shape, tensors, unread = None, [], []
        arrays, array_bytes, self.unread = _numpy_floats(unread)
        self.seen = bool(tensors) or arrays is not None
        self.nbytes = sum(_held_bytes(t) for t in tensors) + array_bytes
        probe: Any = arrays
        for t in tensors:
            try:
                if t.dtype.is_floating_point:
                    value = finiteness_probe(t)
                    probe = value if probe is None else probe + value
            except Exception:  # noqa: S112 - this tensor's finiteness is not measured
                continue
        try:
            self.finite_probe = None if probe is None else probe if type(probe) is float else defer(probe)
        except Exception:  # a meta tensor has no value to read
            self.finite_probe = None
        first = _shape_or_none(tensors[0]) if tensors else None
        self.size = graph_samples(batch) if is_graph_data(type(batch)) else first[0] if first else None
        self.tokens = None


def _shape_or_none(t: torch.Tensor) -> list[int] | None:
    try:
        return list(t.shape)
    except Exception:  # a nested tensor of ragged parts
        return None


def _held_bytes(t: torch.Tensor) -> int:
    """The bytes a tensor holds: ``nbytes``, or a sparse COO tensor's values and indices, or 0."""
    try:
        return int(t.nbytes)
    except Exception:
        try:
            return int(t._values().nbytes + t._indices().nbytes)
        except Exception:
            return 0
