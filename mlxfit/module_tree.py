"""Walking an mlx.nn.Module tree quickly.

mlx.nn's own traversals (named_modules, parameters, apply_to_modules) go
through a generic tree filter that costs about a millisecond per block; sizing
a model walks it several times, and planning sizes dozens of models. These
walk the same dicts and lists directly and keep mlx.nn's rule for what is a
parameter.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn


def walk(value, prefix: str = "", skip=None) -> list:
    """(path, module or array) of a module tree, parents first, without
    mlx.nn's generic tree machinery (tens of times faster for a whole model).
    `skip`: ids of modules left out (the blocks)."""
    out, stack = [], [(prefix, value)]
    while stack:
        path, v = stack.pop()
        if skip and id(v) in skip:
            continue
        if isinstance(v, mx.array):
            out.append((path, v))
            continue
        if isinstance(v, nn.Module):
            out.append((path, v))
        if isinstance(v, dict):
            items = v.items()
        elif isinstance(v, (list, tuple)):
            items = enumerate(v)
        else:
            continue
        children = []
        for k, child in items:
            # mlx.nn.Module.parameters(): members whose name starts with "_" are not parameters.
            if isinstance(child, (mx.array, dict, list, tuple)) and not (isinstance(k, str) and k.startswith("_")):
                children.append((f"{path}.{k}" if path else str(k), child))
        stack.extend(reversed(children))
    return out


def modules(value, skip=None) -> list[tuple[str, nn.Module]]:
    return [(k, m) for k, m in walk(value, skip=skip) if isinstance(m, nn.Module)]


def size(value, skip=None) -> int:
    return sum(a.size for _, a in walk(value, skip=skip) if isinstance(a, mx.array))


def arrays(value, skip=None) -> list[tuple[str, mx.array]]:
    """What tree_flatten(module.parameters()) gives, in walking order."""
    return [(k, a) for k, a in walk(value, skip=skip) if isinstance(a, mx.array)]


def nbytes(value, skip=None) -> int:
    return sum(a.nbytes for _, a in walk(value, skip=skip) if isinstance(a, mx.array))


def set_dtype(module: nn.Module, dtype: mx.Dtype) -> None:
    """nn.Module.set_dtype: every floating-point parameter cast to `dtype`."""
    for _, m in modules(module):
        _cast(m, dtype)


def _cast(container, dtype) -> None:
    """Cast the arrays held directly in a module, or in its plain lists and dicts."""
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for k, v in list(items):
        if isinstance(k, str) and k.startswith("_"):
            continue
        if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating):
            container[k] = v.astype(dtype)
        elif isinstance(v, (list, dict)) and not isinstance(v, nn.Module):
            _cast(v, dtype)
