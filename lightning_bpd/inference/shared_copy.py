"""A copy of a model's module tree that shares its weights: what a runtime decodes with. Torch only.

A runtime sets its own things on the modules it decodes with (their products, lean steps, eval mode), so it needs
modules of its own; it does not need weights of its own. :func:`shared_copy` copies every module object of the tree
(each keeps its attributes, a shallow copy of them) and hands the copies the original's own parameter and buffer
tensors: the copy adds the module objects' few bytes, not the weights. Weights are copied only
where the runtime's dtype is not theirs (:func:`cast_copy`), and a runtime's products make their own packed, int8 or
float64 copies (:mod:`lightning_bpd.inference.product_kinds`).

The copy reads the live weights: a training step changes what it decodes (in place, as optimizers step), while the
products' packed copies, made when the runtime is built, stay as they were: build another runtime after training.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def shared_copy(model: nn.Module) -> nn.Module:
    """Every module of ``model`` copied, the parameters and buffers the original's own tensors (a module reached
    twice, e.g. tied embeddings, is copied once)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"a runtime takes a torch module (nn.Module); {type(model).__name__} is not one")
    made: dict[int, nn.Module] = {}

    def copy_of(module: nn.Module) -> nn.Module:
        if id(module) in made:
            return made[id(module)]
        clone = module.__class__.__new__(module.__class__)
        clone.__dict__ = module.__dict__.copy()
        if "config" in clone.__dict__ and not isinstance(clone.__dict__["config"], nn.Module):
            clone.__dict__["config"] = copy.copy(clone.__dict__["config"])  # what decoding records stays its own
        clone._parameters = dict(module._parameters)
        clone._buffers = dict(module._buffers)
        made[id(module)] = clone
        clone._modules = {name: None if child is None else copy_of(child) for name, child in module._modules.items()}
        return clone

    copied = copy_of(model)
    rebound: dict[int, object] = {}
    for clone in made.values():  # attributes that point into the tree (an image read-out's model) point into the copy
        for key, value in list(clone.__dict__.items()):
            clone.__dict__[key] = rebind(value, made, rebound)
    return copied


def rebind(value: object, made: dict[int, nn.Module], rebound: dict[int, object]) -> object:
    """``value`` as the copy should hold it: a module of the tree -> its copy; a plain object whose attributes point
    to modules of the tree -> a shallow copy pointing to their copies (once per object); anything else as it is."""
    if isinstance(value, nn.Module):
        return made.get(id(value), value)
    if isinstance(value, (torch.Tensor, type)):
        return value
    try:
        fields = vars(value)
    except TypeError:  # no attributes of its own (a number, a string, a slotted object)
        return value
    refs = {key: made[id(v)] for key, v in fields.items() if isinstance(v, nn.Module) and id(v) in made}
    if not refs:
        return value
    if id(value) not in rebound:
        other = copy.copy(value)
        vars(other).update(refs)
        rebound[id(value)] = other
    return rebound[id(value)]


def cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``model`` (a :func:`shared_copy`) with its floating-point parameters and buffers that are not ``dtype``
    replaced by copies in ``dtype`` (a tensor met twice is copied once, so ties stay ties); the others stay shared.
    Unlike ``module.to(dtype)``, which swaps the data of the parameters in place, the original keeps its own."""
    cast: dict[int, torch.Tensor] = {}

    def converted(t: torch.Tensor, parameter: bool) -> torch.Tensor:
        if id(t) not in cast:
            data = t.detach().to(dtype)
            cast[id(t)] = nn.Parameter(data, requires_grad=False) if parameter else data
        return cast[id(t)]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                module._parameters[name] = converted(p, True)  # type: ignore[assignment]
        for name, b in module._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                module._buffers[name] = converted(b, False)
    return model


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers, each tensor counted once."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def own_bytes(copy: nn.Module, original: nn.Module) -> int:
    """Bytes of the parameters and buffers of ``copy`` that are not ``original``'s own tensors (its cast copies)."""
    theirs = {id(t) for t in [*original.parameters(), *original.buffers()]}
    mine: dict[int, int] = {}
    for t in [*copy.parameters(), *copy.buffers()]:
        if id(t) not in theirs:
            mine[id(t)] = t.numel() * t.element_size()
    return sum(mine.values())
