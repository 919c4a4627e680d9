"""Measuring the memory a computation allocates: the largest tensor it creates, and its peak (chapter 11).

On CUDA, ``torch.cuda.max_memory_allocated`` counts every byte the caching allocator hands out, kernels'
workspaces included. The CPU has no such counter, so :class:`AllocationTracker` watches PyTorch's operators
instead: a ``TorchDispatchMode`` sees every operator that runs while it is active, notes each tensor whose
storage the operator newly allocated (views and in-place results share their input's storage and are not
counted), and a finaliser on each storage notes when it is freed. Its figures are the bytes of the tensors
that operators return; a fused kernel's internal buffers (``F.scaled_dot_product_attention``'s on the CPU)
stay invisible to it.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class Allocation:
    """One tensor that an operator allocated: its number of elements, shape, dtype and the operator."""

    elements: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    operator: str

    @property
    def bytes(self) -> int:
        return self.elements * self.dtype.itemsize


class AllocationTracker(TorchDispatchMode):
    """While active, track the tensors that PyTorch's operators allocate.

    Attributes:
        live: bytes allocated inside the block and not yet freed.
        peak: the largest value ``live`` took (bytes): the block's peak memory beyond its inputs.
        largest: the largest tensor allocated (:class:`Allocation`), or None.
        largest_floating: the largest floating-point tensor allocated: where attention's scores would show
            (boolean masks the size of the mask given are not scores).

    Example::

        with AllocationTracker() as tracker:
            output = attention(query, key, value)
        tracker.peak, tracker.largest_floating.shape

    Works on any device: it reads storages, not an allocator. Only operators count: a tensor made outside
    the block (the inputs) is not counted, and neither is memory that a kernel allocates inside itself.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing is compiled under the tracker: wrapping __torch_dispatch__
        # in torch._dynamo.disable would only import torch._dynamo on the
        # first operator, about 5 s
        return False

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.largest: Allocation | None = None
        self.largest_floating: Allocation | None = None
        # (device, address) of each live storage -> (bytes, a weak reference
        # whose callback frees it)
        self._live: dict[
            tuple[torch.device, int], tuple[int, weakref.ref]
        ] = {}

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        # kept lean: under the checks' profiler every Python call and
        # builtin here costs a callback
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        # the storages of the operator's tensor arguments,
        # found when first needed
        given = None
        for tensor in (
            result if isinstance(result, tuple | list) else (result,)
        ):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            where, size = (
                (tensor.device, storage.data_ptr()),
                storage.nbytes(),
            )
            # empty, or a view of (or in place on) a tracked tensor
            if size == 0 or where in self._live:
                continue
            if given is None:
                given = {
                    (t.device, t.untyped_storage().data_ptr())
                    for t in _tensors((*args, *kwargs.values()))
                }
            # a view of an argument made before the block, or an
            # in-place result on one
            if where in given:
                continue
            self._live[where] = (
                size,
                weakref.ref(storage, functools.partial(self._free, where)),
            )
            self.live += size
            self.peak = max(self.peak, self.live)
            elements = size // tensor.element_size()
            if self.largest is None or elements > self.largest.elements:
                self.largest = Allocation(
                    elements, tuple(tensor.shape), tensor.dtype, str(func)
                )
            if tensor.is_floating_point() and (
                self.largest_floating is None
                or elements > self.largest_floating.elements
            ):
                self.largest_floating = Allocation(
                    elements, tuple(tensor.shape), tensor.dtype, str(func)
                )
        return result

    def _free(
        self, where: tuple[torch.device, int], _: weakref.ref
    ) -> None:
        """The storage at ``where`` is gone (the callback of its weak reference)."""
        size, _ = self._live.pop(where, (0, None))
        self.live -= size


def _tensors(values: tuple | list) -> list[torch.Tensor]:
    """The tensors among ``values`` and in the lists and tuples among them (operators' arguments)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, tuple | list):
            found.extend(
                item for item in value if isinstance(item, torch.Tensor)
            )
    return found


def peak_memory(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, int, str]:
    """``fn(*args, **kwargs)``, the peak of the memory it allocated beyond its inputs (bytes), and how.

    On CUDA (where the first tensor argument lives) the figure is ``torch.cuda.max_memory_allocated`` after
    ``reset_peak_memory_stats``, less what was allocated before the call: every byte, kernels' workspaces
    included. Elsewhere it is :class:`AllocationTracker`'s ``peak``: the tensors that operators return.

    Returns:
        ``(result, peak_bytes, "torch.cuda.max_memory_allocated" | "operator outputs")``.
    """
    first = next(
        (
            a
            for a in (*args, *kwargs.values())
            if isinstance(a, torch.Tensor)
        ),
        None,
    )
    if first is not None and first.device.type == "cuda":
        torch.cuda.synchronize(first.device)
        torch.cuda.reset_peak_memory_stats(first.device)
        before = torch.cuda.memory_allocated(first.device)
        result = fn(*args, **kwargs)
        torch.cuda.synchronize(first.device)
        return (
            result,
            torch.cuda.max_memory_allocated(first.device) - before,
            "torch.cuda.max_memory_allocated",
        )
    with AllocationTracker() as tracker:
        result = fn(*args, **kwargs)
    return result, tracker.peak, "operator outputs"
