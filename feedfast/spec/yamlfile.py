"""Reading a YAML spec strictly: a key repeated in one mapping is an error naming its key path and both lines.

YAML's loaders keep the last of two equal keys silently (``size: 224`` then ``size: 160`` gives 160); a
spec is the user's contract, so feedfast refuses it, as TOML does. The check walks the composed node
tree before construction, each node once (aliases share nodes, so an alias bomb or loop is walked
once, not expanded).
"""

from __future__ import annotations

from typing import Any

from feedfast.errors import SpecError


def load_yaml(text: str, *, file: str) -> Any:
    """The data of a YAML document, as ``yaml.safe_load`` gives it, refusing repeated keys.

    Raises:
        SpecError: a mapping holds one key twice (names ``file``, the key path and both lines).
        yaml.YAMLError: the text is not YAML (the caller names the file).
    """
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_keys(node, file)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_keys(root: Any, file: str) -> None:
    import yaml

    seen: set[int] = set()
    pending: list[tuple[Any, str]] = [(root, "")]
    while pending:
        node, path = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, f"{path}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[tuple[str, str], int] = {}  # (tag, text): `1` and `"1"` are two keys
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                line = key_node.start_mark.line + 1
                child = f"{path}.{key}" if path else key
                if isinstance(key_node, yaml.ScalarNode):
                    if (key_node.tag, key) in first_line:
                        raise SpecError(f"key `{key}` is given twice, on lines {first_line[key_node.tag, key]} and "
                                        f"{line}; YAML would keep the last silently", file=file, key=child,
                                        fix="keep one of the two (a spec sets each key once)")
                    first_line[key_node.tag, key] = line
                pending.append((value_node, child))
