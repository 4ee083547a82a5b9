"""Drafting methods, declared once (`peftbd.methods.registry`): importing this package registers
the built-in ones, in the report's order.

    from peftbd.methods import method, methods, by_serving
    for m in methods(): m.arms(cfg), m.task(cfg), m.load(ctx, out_dir), m.drafter(module, ctx, arm)

A new drafter is one module that calls `register` (docs/adding-a-drafter.md).
"""

from peftbd.methods import peft_bd  # noqa: F401  (each import registers its method: report order)
from peftbd.methods import fastmtp  # noqa: F401, I001
from peftbd.methods import bd_head  # noqa: F401, I001
from peftbd.methods import dflash  # noqa: F401, I001
from peftbd.methods.arm import AR, AR_ARM, ArmSpec
from peftbd.methods.registry import (
    DraftContext,
    Method,
    by_kind,
    by_serving,
    method,
    methods,
    register,
    serving_names,
    unregister,
)

__all__ = ["AR", "AR_ARM", "ArmSpec", "DraftContext", "Method", "by_kind", "by_serving", "method",
           "methods", "register", "serving_names", "unregister"]
