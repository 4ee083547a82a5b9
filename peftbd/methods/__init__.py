"""Drafting methods, declared once (`peftbd.methods.registry`): importing this package registers
the built-in ones, in the report's order.

    from peftbd.methods import method, methods
    for m in methods(): m.arms(cfg), m.load(ctx, out_dir), m.drafter(module, ctx, arm)

A new drafter is one module that calls `register` (docs/adding-a-drafter.md): a built-in one is
imported here, any other through `methods.plugins` in the config.
"""

from peftbd.methods import peft_bd  # noqa: F401  (each import registers its method: report order)
from peftbd.methods import fastmtp  # noqa: F401, I001
from peftbd.methods import bd_head  # noqa: F401, I001
from peftbd.methods import dflash  # noqa: F401, I001
from peftbd.methods import prompt_lookup  # noqa: F401, I001
from peftbd.methods.arm import AR, AR_ARM, ArmSpec
from peftbd.methods.registry import (
    DraftContext,
    Former,
    Method,
    by_serving,
    defaults_beside,
    method,
    methods,
    register,
    renamed,
    serving_names,
    unregister,
)

__all__ = ["AR", "AR_ARM", "ArmSpec", "DraftContext", "Former", "Method", "by_serving",
           "defaults_beside", "method", "methods", "register", "renamed", "serving_names", "unregister"]
