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


def leaf_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) of nn.Module.leaf_modules(), in the order nn.quantize visits
    them. mlx.nn's rule: below the module, dicts and lists are followed; a module
    is a leaf when none of its children (the modules found through its dicts and
    lists) holds anything, i.e. tree_flatten(module.children()) is empty."""
    out = []

    def unwrap(value, path: str) -> None:
        if isinstance(value, nn.Module) and not _has_children(value):
            out.append((path, value))
            return
        for k, child in value.items() if isinstance(value, dict) else enumerate(value):
            if isinstance(child, (dict, list)):
                unwrap(child, f"{path}.{k}")

    for k, child in module.items():
        if isinstance(child, (dict, list)):
            unwrap(child, k)
    return out


def _has_children(module: nn.Module) -> bool:
    stack = [v for v in module.values() if isinstance(v, (dict, list))]
    while stack:
        v = stack.pop()
        if isinstance(v, nn.Module):
            if _holds_anything(v):
                return True
            continue
        stack.extend(x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, (dict, list)))
    return False


def _holds_anything(value) -> bool:
    """tree_flatten(value) is not empty: something other than dicts, lists and tuples inside."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        else:
            return True
    return False


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
