"""Loading a run configuration: YAML (1.2 numbers, no duplicated keys, ``extends:``), ``--set`` overrides, and
validation errors turned into one line that names the file (or override) that set the bad key.

The schema it validates against is :mod:`esjax.config.schema`.
"""

from __future__ import annotations

import contextvars
import copy
import difflib
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from esjax.config.schema import Config, ConfigError, EnvSection, env_section_of
from esjax.errors import TaskError

Origins = dict[tuple[str, ...], str]  # key path -> the file (or --set) that set it
#: The ``env`` section model of the config being reported on (its task's keys included), for key paths and hints.
_ENV_SECTION: contextvars.ContextVar[type[BaseModel]] = contextvars.ContextVar("env_section", default=EnvSection)


class _Loader(yaml.SafeLoader):
    """Safe YAML with YAML 1.2 numbers: ``1e-3`` and ``1E5`` are floats (YAML 1.1 wants a dot)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def _duplicate_key(node: yaml.Node, path: tuple[str, ...] = ()) -> tuple[str, int] | None:
    """(dotted key, line) of the first key set twice in one mapping, or None."""
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key != "<<":
                if key in seen:
                    return ".".join((*path, str(key))), key_node.start_mark.line + 1
                seen.add(key)
            found = _duplicate_key(value_node, (*path, str(key)))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, (*path, str(i)))
            if found:
                return found
    return None


def _load_yaml(text: str, source: str) -> Any:
    """One YAML document (None when empty); a key set twice in a mapping is an error."""
    loader = None
    try:
        loader = _Loader(text)  # the reader already rejects non-printable characters
        node = loader.get_single_node()
        if node is None:
            return None
        duplicate = _duplicate_key(node)
        if duplicate is not None:
            raise ConfigError(f"{source}: duplicated key {duplicate[0]!r} (line {duplicate[1]}); each key may be "
                              "set once")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: not valid YAML{where}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set {dotted!r}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``'es.sigma=0.01'`` → ``('es.sigma', 0.01)``; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {text!r}: empty key")
    value = _load_yaml(raw, f"--set {text!r}") if raw.strip() else ""
    return key.strip(), value


def _blame(key: tuple[str, ...], origins: Origins, default: str) -> str:
    """The file (or --set) that set ``key`` or its closest enclosing section; ``default`` when none did."""
    for n in range(len(key), 0, -1):
        if key[:n] in origins:
            return origins[key[:n]]
    return default


def _kinds(field: Any) -> dict[str, type[BaseModel]] | None:
    """kind -> model of a field that is a discriminated union of sections (schedule, es.optimizer), else None."""
    if field.discriminator is None:
        return None
    return {member.model_fields["kind"].default: member for member in typing.get_args(field.annotation)}


def _section_of(model: type[BaseModel] | None, name: str) -> tuple[type[BaseModel] | None, dict[str, type] | None]:
    """The section model of field ``name`` of ``model`` (None for a plain value) and, for a union, its kinds."""
    field = model.model_fields.get(name) if model is not None else None
    if field is None:
        return None, None
    if model is Config and name == "env":  # the task's section, with its own keys
        return _ENV_SECTION.get(), None
    kinds = _kinds(field)
    if kinds is not None:
        return None, kinds
    kind = field.annotation
    return (kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None), None


def _resolve_loc(loc: tuple[Any, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], str, dict[str, type]] | None]:
    """A pydantic error location as the user's key path, without the kind tags pydantic inserts after a
    discriminated union (``('schedule', 'async', 'lag')`` → ``('schedule', 'lag')``), and the innermost union
    on the way: (its path, the kind chosen, all its kinds)."""
    path: list[str] = []
    union = None
    model: type[BaseModel] | None = Config
    parts = [str(part) for part in loc]
    i = 0
    while i < len(parts):
        path.append(parts[i])
        model, kinds = _section_of(model, parts[i])
        i += 1
        if kinds is not None and i < len(parts) and parts[i] in kinds:
            union = (tuple(path), parts[i], kinds)
            model = kinds[parts[i]]
            i += 1
    return tuple(path), union


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _format_validation_error(err: ValidationError, source: str, origins: Origins | None = None) -> str:
    origins = origins or {}
    first = err.errors()[0]
    path, union = _resolve_loc(first["loc"])
    loc = ".".join(path)
    msg = first["msg"]
    if first["type"] == "union_tag_invalid":  # an unknown kind of schedule / optimizer
        _, kinds = _section_of(_resolve_model(path[:-1]), path[-1])
        key = path if path in _SHORTHAND_UNIONS else (*path, "kind")
        expected = _and([repr(kind) for kind in kinds or {}]).replace(" and ", " or ")
        return (f"{_blame(key, origins, source)}: {'.'.join(key)}: unknown kind {_short(first['input'].get('kind'))}; "
                f"expected {expected}")
    if union is not None and len(path) == len(union[0]) + 1:  # a key of a kind's section
        section, kind, kinds = union
        where = f"{'.'.join(section)} kind {kind!r}"
        if first["type"] == "extra_forbidden":
            owners = [other for other, model in kinds.items() if path[-1] in model.model_fields]
            if owners:
                keys = ", ".join(kinds[kind].model_fields)
                return (f"{_blame(path, origins, source)}: {loc}: not a key of {where} (only {_and(owners)} "
                        f"{'has' if len(owners) == 1 else 'have'} it; {kind} has {keys})")
        elif first["type"] == "missing":
            return f"{_blame((*section, 'kind'), origins, source)}: {loc}: required for {where}"
    if first["type"] == "extra_forbidden":
        hint = _did_you_mean(path)
        return f"{_blame(path, origins, source)}: unknown key {loc!r}" + (f"; did you mean {hint!r}?" if hint else "")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        # Validators name their own key ("es.population: ..."); keep that form and blame that key's file.
        named = msg.split(" ")[0]
        if named.endswith(":") and "." in named:
            return f"{_blame(tuple(named[:-1].split('.')), origins, source)}: {msg}"
        return f"{_blame(path, origins, source)}: {loc}: {msg}"
    got = first.get("input")
    got_text = f" (got {_short(got)})" if got is not None and not isinstance(got, dict) else ""
    return f"{_blame(path, origins, source)}: {loc}: {msg}{got_text}"


_SHORTHAND_UNIONS = {("es", "optimizer")}  # unions also written as a bare kind name (optimizer: adam)


def _resolve_model(path: tuple[str, ...]) -> type[BaseModel] | None:
    """The section model at a key path of :class:`Config` (None past a plain value or a union)."""
    model: type[BaseModel] | None = Config
    for name in path:
        model, _ = _section_of(model, name)
    return model


def _known_keys(model: type[BaseModel] | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every settable key path of :class:`Config` (sections and their fields; a union's: every kind's)."""
    out: list[tuple[str, ...]] = []
    for name in (model or Config).model_fields:
        out.append((*prefix, name))
        section, kinds = _section_of(model or Config, name)
        for sub in ([section] if section is not None else list((kinds or {}).values())):
            out.extend(key for key in _known_keys(sub, (*prefix, name)) if key not in out)
    return out


def _did_you_mean(path: tuple[str, ...]) -> str | None:
    """The known key closest to the unknown ``path``: a sibling spelled alike (``es.sigmma`` → ``es.sigma``),
    else the same name or a close one in another section (``run.sigma`` → ``es.sigma``); None when nothing is close."""
    known = _known_keys()
    siblings = [key[-1] for key in known if key[:-1] == path[:-1]]
    close = difflib.get_close_matches(path[-1], siblings, n=1, cutoff=0.6)
    if close:
        return ".".join((*path[:-1], close[0]))
    elsewhere = {".".join(key): key[-1] for key in known if len(key) == len(path) and key[:-1] != path[:-1]}
    same = [dotted for dotted, name in elsewhere.items() if name == path[-1]]
    if len(same) == 1:
        return same[0]
    close = difflib.get_close_matches(".".join(path), list(elsewhere), n=1, cutoff=0.8)
    return close[0] if close else None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def config_from_dict(raw: dict[str, Any], source: str = "<config>", origins: Origins | None = None) -> Config:
    """Validate a plain dict into a :class:`Config`, raising :class:`ConfigError` on any problem.

    ``origins`` (key path → file) names the file that set a bad key; ``source`` is named otherwise."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        try:
            env = env_section_of(raw.get("env"))
        except TaskError:
            env = EnvSection
        token = _ENV_SECTION.set(env)
        try:
            message = _format_validation_error(err, source, origins)
        finally:
            _ENV_SECTION.reset(token)
        raise ConfigError(message) from None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def key_paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of a nested mapping, sections before their keys (``("es",)``, ``("es", "sigma")``, ...)."""
    for key, value in tree.items():
        yield (*prefix, str(key))
        if isinstance(value, dict):
            yield from key_paths(value, (*prefix, str(key)))


def _read_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], Origins]:
    """A config file as a dict, ``extends:`` merged underneath, and which file set each key."""
    file = Path(path)
    try:
        if not file.is_file():
            raise ConfigError(f"{path}: config file not found" if not file.exists() else f"{path}: not a file")
        data = file.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror or err.__class__.__name__})") from None
    except ValueError as err:  # an embedded NUL byte in the path
        raise ConfigError(f"{str(path)[:200]!r}: not a usable config path ({err})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start})") from None
    raw = _load_yaml(text, str(path))
    if raw is None:
        raise ConfigError(f"{path}: the config file is empty (expected a mapping of sections such as 'run:', 'es:'; "
                          "write '{}' for all defaults)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    origins: Origins = {}
    merged = raw
    if parent is not None:
        if not isinstance(parent, str) or not parent.strip():
            raise ConfigError(f"{path}: extends: expected a file name, got {_short(parent)}")
        parent_file = (file.parent / parent).resolve()
        if parent_file in _seen or parent_file == file.resolve():
            raise ConfigError(f"{path}: extends: {parent} forms a cycle")
        if not parent_file.is_file():
            raise ConfigError(f"{path}: extends: {parent!r} not found ({parent_file})")
        base, origins = _read_tree(parent_file, (*_seen, file.resolve()))
        merged = _deep_merge(base, raw)
    origins.update(dict.fromkeys(key_paths(raw), str(path)))
    return merged, origins


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file as a dict, with ``extends: OTHER.yaml`` (relative to the file) merged underneath."""
    return _read_tree(path)[0]


def load_config(path: str | Path | None, overrides: list[str] | None = None, *,
                base: dict[str, Any] | None = None, base_source: str = "<base>") -> Config:
    """Read a YAML config file (or defaults when ``path`` is None) and apply ``--set`` overrides.

    ``base`` (a dict of sections, e.g. the settings an export recorded beside its weights) lies under the
    file: keys the file or an override sets win; a bad key of ``base`` is blamed on ``base_source``."""
    source = str(path) if path is not None else "<defaults>"
    raw, origins = _read_tree(path) if path is not None else ({}, {})
    if base:
        if not isinstance(base, dict):
            raise ConfigError(f"{base_source}: expected a mapping of sections, got {type(base).__name__}")
        under = dict.fromkeys(key_paths(base), base_source)
        raw, origins = _deep_merge(base, raw), {**under, **origins}
        if path is None:
            source = base_source
    for text in overrides or []:
        key, value = parse_override(text)
        where = f"--set {text[:200] if text.isprintable() else repr(text[:200])}"
        _set_dotted(raw, key, value, where)
        keys = tuple(key.split("."))
        origins[keys] = where
        for n in range(1, len(keys)):  # a section only this override names (an unknown one is blamed on it)
            origins.setdefault(keys[:n], where)
        if isinstance(value, dict):
            origins.update(dict.fromkeys(((*keys, *sub) for sub in key_paths(value)), where))
    return config_from_dict(raw, source, origins)


def config_to_yaml(config: Config) -> str:
    """The resolved config, as written into every run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
