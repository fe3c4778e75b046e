"""YAML as users write it: parsed safely, and a key given twice is an error with its line.

PyYAML keeps the last of two equal keys silently; in a spec or a tuned config that hides a
typo (two `strategies:` blocks, one shadowing the other).
"""

from __future__ import annotations

from typing import Any

import yaml

from overlapbench.errors import UserError, field_name


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:  # the mapping's own keys; `<<` merges may be overridden
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise UserError(f"line {line}: {field_name(key)} is given twice (first at line {seen[key]}); keep one")
                seen[key] = line
            except TypeError:  # an unhashable key: the constructor below says so
                continue
        return super().construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping)


def load(text: str) -> Any:
    """The document in `text`; yaml.YAMLError for bad syntax, UserError for a repeated key."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: safe
