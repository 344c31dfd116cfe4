"""The one YAML loader of config.yaml and secrets.yaml (pure: text in, data out).

Safe (plain data only) and strict: a key written twice in one mapping is refused, so a hand
edit never loses a value silently. Problems are raised as :class:`ConfigError` naming the
line, the column and the problem (a duplicate key by its name), never a value.
"""

from typing import Any

import yaml

from protocol.errors import ConfigError

__all__ = ["load_yaml"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """A safe loader that refuses a key written twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key_node.value!r}", key_node.start_mark)
                seen.add(ident)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> object:
    """The data of one YAML document (``None`` for an empty one).

    Raises :class:`ConfigError` (no path) for malformed YAML: ``malformed YAML at line L,
    column C: <problem>``.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid syntax"
        raise ConfigError("", f"malformed YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"malformed YAML: {exc}") from None
    except (ValueError, TypeError, AttributeError, OverflowError):
        # A scalar that its explicit tag cannot read (``!!int abc``): the exception's text
        # would quote the value, which may be a secret.
        raise ConfigError("", "malformed YAML: a value does not match its tag") from None
