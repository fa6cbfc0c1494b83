"""A runtime's snapshot takes its products: every module that multiplies gets the runtime's kind, and every plain
``nn.Linear`` (a Hugging Face base calls its own) becomes a :class:`ProductLinear`. Inference only. Torch only."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.nn.products import FLOAT, Products


class ProductLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose forward multiplies through ``self.products``: a runtime turns every plain
    ``nn.Linear`` of its snapshot into one (:func:`use_products`), so that a model whose modules call their
    linear layers directly (a Hugging Face base) takes the runtime's precision too. Same parameters, same
    state dict."""

    products: Products = FLOAT

    def forward(self, x: Tensor) -> Tensor:
        return self.products.linear(x, self.weight, self.bias)


def use_products(model: torch.nn.Module, products: Products) -> torch.nn.Module:
    """Give every module of ``model`` that multiplies ``products`` (in place; a runtime does it to its own snapshot):
    modules that hold ``products`` get these, and every plain ``nn.Linear`` becomes a :class:`ProductLinear`.
    Returns ``model``."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = ProductLinear
        if "products" in vars(type(module)) or any("products" in vars(c) for c in type(module).__mro__):
            module.products = products
    return model
