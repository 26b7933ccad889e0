"""YAML (and JSON) loading that remembers where each value was written."""

from __future__ import annotations

import json
from typing import Any

import yaml


class LDict(dict):  # type: ignore[type-arg]
    """A mapping with the (line, col) of itself, of each key and of each value (1-based)."""

    pos: tuple[int, int] = (1, 1)

    def __init__(self) -> None:
        super().__init__()
        self.key_pos: dict[Any, tuple[int, int]] = {}
        self.val_pos: dict[Any, tuple[int, int]] = {}


class LList(list):  # type: ignore[type-arg]
    pos: tuple[int, int] = (1, 1)

    def __init__(self) -> None:
        super().__init__()
        self.item_pos: list[tuple[int, int]] = []


def _pos(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    def __init__(self) -> None:
        self.ctor = yaml.constructor.SafeConstructor()

    def build(self, node: yaml.Node) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.ctor.flatten_mapping(node)
            d = LDict()
            d.pos = _pos(node)
            for knode, vnode in node.value:
                key = self.build(knode)
                if isinstance(key, LDict | LList):
                    key = str(key)
                d[key] = self.build(vnode)
                d.key_pos[key] = _pos(knode)
                d.val_pos[key] = _pos(vnode)
            return d
        if isinstance(node, yaml.SequenceNode):
            lst = LList()
            lst.pos = _pos(node)
            for item in node.value:
                lst.append(self.build(item))
                lst.item_pos.append(_pos(item))
            return lst
        return self.ctor.construct_object(node, deep=True)


def load_all(text: str) -> list[Any]:
    """Every document of ``text`` with positions; raises yaml.YAMLError (with ``problem_mark``)."""
    builder = _Builder()
    return [builder.build(doc) for doc in yaml.compose_all(text, Loader=yaml.SafeLoader) if doc is not None]


def load_json_or_yaml(text: str) -> list[Any]:
    """JSON through the position-keeping YAML loader; plain ``json`` as a fallback (no positions)."""
    try:
        return load_all(text)
    except yaml.YAMLError:
        return [json.loads(text)]
