"""Read a recipe file: YAML with positions, upgrade, validate, report every error at once."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from embtrain.errors import RecipeError
from embtrain.kernels.optimizer_spec import OPTIMIZER_NAMES
from embtrain.recipe.checks import cross_checks
from embtrain.recipe.models import CURRENT_VERSION, DENSE_MODELS, Recipe


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``1e-3`` and ``2E5`` as floats (YAML 1.2) like ``1.0e-3``.

    YAML 1.1 reads an exponent without a dot as a string; with strict validation that string
    would be refused as "not a number" although the user wrote a number. A plain ``null``
    key is the string ``"null"`` (a categorical feature's ``null:`` rule), not None.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        for key, _ in node.value:
            if (isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:null"
                    and key.value == "null"):
                key.tag = "tag:yaml.org,2002:str"
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _type_message(err: dict[str, Any]) -> str | None:
    """A clearer message for a value of the wrong type (strict validation coerces nothing)."""
    value = err.get("input")
    expected = {"int_type": "an integer", "float_type": "a number",
                "string_type": "a string", "bool_type": "true or false"}.get(err["type"])
    if expected is None:
        return None
    if isinstance(value, bool):
        got = f"the boolean {str(value).lower()}"
    elif isinstance(value, str):
        got = f"the string {value!r}" + ("; write numbers without quotes"
                                         if expected in ("an integer", "a number") else "")
    elif isinstance(value, float) and expected == "an integer":
        got = f"{value!r}, which is not a whole number"
    elif value is None:
        got = "nothing (null)"
    else:
        got = f"{type(value).__name__} {value!r:.40}"
    return f"expected {expected}, got {got}"


# Upgraders from version N to N+1, applied in order to older recipes.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}

# Components of a pydantic error location that name a union member, not a key of the file.
_UNION_TAGS = {
    "dense", "categorical", "uniform", "normal", "truncated_normal", "zeros", "constant",
    "none", "count", "bloom", "probability", *OPTIMIZER_NAMES,
    *DENSE_MODELS, "str", "list[str]",
    "int", "function-before[parse_count(), int]", "function-before[parse_bytes(), int]",
    "literal['variable']", "float", "bool", "NullId", "list", "mapping",
}


class _Positions:
    """Maps a path inside the YAML document to the node's line and column (1-based)."""

    def __init__(self, root: yaml.Node | None):
        self.root = root

    def locate(self, path: tuple[Any, ...]) -> tuple[int, int]:
        node = self.root
        if node is None:
            return 1, 1
        best = node.start_mark
        for part in path:
            child, key_node = self._child(node, part)
            if child is None:
                break
            node, best = child, (key_node.start_mark if key_node is not None and part == path[-1] else child.start_mark)
        return best.line + 1, best.column + 1

    def locate_key(self, path: tuple[Any, ...]) -> tuple[int, int]:
        """Position of the key (not the value) that ends ``path``, e.g. an unknown key."""
        parent = self.root
        for part in path[:-1]:
            child, _ = self._child(parent, part) if parent is not None else (None, None)
            if child is None:
                return self.locate(path)
            parent = child
        if isinstance(parent, yaml.MappingNode):
            for key, _value in parent.value:
                if key.value == str(path[-1]):
                    return key.start_mark.line + 1, key.start_mark.column + 1
        return self.locate(path)

    @staticmethod
    def _child(node: yaml.Node, part: Any) -> tuple[yaml.Node | None, yaml.Node | None]:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    return value, key
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            return node.value[part], None
        return None, None


def _duplicate_keys(node: yaml.Node | None, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], yaml.Node]]:
    found: list[tuple[tuple[Any, ...], yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if key.value in seen:
                found.append(((*path, key.value), key))
            seen.add(key.value)
            found += _duplicate_keys(value, (*path, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            found += _duplicate_keys(value, (*path, i))
    return found


def format_path(path: tuple[Any, ...]) -> str:
    """``('features', 2, 'table')`` → ``features[2].table``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(recipe)"


def _clean_loc(loc: tuple[Any, ...], raw: Any) -> tuple[Any, ...]:
    """Drop union-member names that pydantic puts in error locations but the file does not have."""
    out: list[Any] = []
    node = raw
    for part in loc:
        if (isinstance(node, dict) and part in node) or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            out.append(part)
            node = node[part]
        elif isinstance(part, str) and (part in _UNION_TAGS or part.startswith(("function-", "literal["))):
            continue
        else:
            out.append(part)
            node = None
    return tuple(out)


def upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring an older recipe mapping to the current version (no-op for current ones)."""
    version = raw.get("version")
    while isinstance(version, int) and version < CURRENT_VERSION and version in UPGRADES:
        raw = UPGRADES[version](raw)
        version = raw.get("version")
    return raw


MAX_DEPTH = 100  # nesting levels of a recipe (real ones have fewer than 10)


def _check_depth(text: str, filename: str) -> None:
    """Refuse YAML nested deeper than :data:`MAX_DEPTH`, at the position where it gets too deep.

    PyYAML's composer and constructor recurse once per level (a RecursionError for a document
    nested thousands deep); its parser does not, so the events are counted first.
    """
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                mark = event.start_mark
                raise RecipeError([f"{filename}:{mark.line + 1}:{mark.column + 1}: yaml: nested "
                                   f"deeper than {MAX_DEPTH} levels; a recipe needs far fewer"])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_recipe_text(text: str, filename: str = "<recipe>") -> Recipe:
    """Validate recipe text; raise :class:`RecipeError` listing every problem as ``file:line:col: path: msg``."""
    try:
        _check_depth(text, filename)
        root = yaml.compose(text, Loader=_Loader)
        raw = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise RecipeError([f"{where}: yaml: {problem}"]) from None
    positions = _Positions(root)
    if not isinstance(raw, dict):
        raise RecipeError([f"{filename}:1:1: (recipe): expected a mapping of sections (data, features, ...)"])

    errors: list[tuple[int, int, str]] = []
    for path, key in _duplicate_keys(root):
        errors.append((key.start_mark.line + 1, key.start_mark.column + 1,
                       f"{format_path(path)}: duplicate key"))

    version = raw.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > CURRENT_VERSION:
        line, col = positions.locate(("version",))
        raise RecipeError([f"{filename}:{line}:{col}: version: recipe version {version} is newer than "
                           f"this embtrain understands ({CURRENT_VERSION}); upgrade embtrain"])
    raw = upgrade(raw)

    recipe: Recipe | None = None
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            loc = _clean_loc(tuple(err["loc"]), raw)
            if err["type"] == "extra_forbidden":
                line, col = positions.locate_key(loc)
                message = "unknown key"
            else:
                line, col = positions.locate(loc)
                message = _type_message(err) or err["msg"]
                if message.startswith("Value error, "):
                    message = message[len("Value error, "):]
            errors.append((line, col, f"{format_path(loc)}: {message}"))
    for path, message in cross_checks(raw):
        line, col = positions.locate(path)
        errors.append((line, col, f"{format_path(path)}: {message}"))

    if errors:
        unique = sorted(set(errors))
        raise RecipeError([f"{filename}:{line}:{col}: {msg}" for line, col, msg in unique])
    assert recipe is not None
    return recipe


def name_from_stem(stem: str) -> str:
    """A valid recipe name (``Name``) from a file's stem, for a recipe without ``name:``:
    the stem where it is one; else every run of other characters becomes ``_`` and a leading
    digit, dot or dash gets a ``_`` before it (``2024ctr`` → ``_2024ctr``, ``my recipe`` →
    ``my_recipe``); a stem without a letter or digit (``..``) becomes ``recipe``. The run's
    saved recipe then holds a name every command accepts, and ``runs/<name>`` stays under
    ``runs/``."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", stem) and len(stem) <= 128:
        return stem
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", stem)
    if not re.search(r"[A-Za-z0-9]", name):
        return "recipe"
    if not re.match(r"[A-Za-z_]", name):
        name = "_" + name
    return name[:128]


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file; the recipe's name defaults to the file name."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecipeError([f"{path}: cannot read recipe: {exc.strerror or exc}"]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RecipeError([f"{path}:{line}:{col}: not UTF-8 text (byte 0x{data[exc.start]:02x}); "
                           "save the recipe as UTF-8"]) from None
    recipe = parse_recipe_text(text, str(path))
    if recipe.name is None:
        recipe = recipe.model_copy(update={"name": name_from_stem(path.stem)})
    if recipe.model.type == "keras":
        model = recipe.model.model_copy(update={"path": module_directory(recipe.model.path,
                                                                         path)})
        recipe = recipe.model_copy(update={"model": model})
    return recipe


def module_directory(given: str | None, recipe_file: Path) -> str:
    """Where a ``type: keras`` recipe's module is looked up first, as an absolute path: the
    recipe's directory by default; a relative ``model.path`` is relative to the recipe's
    directory (a run directory's ``recipe.yaml`` names its copy of the module ``model``), or,
    where no such directory exists there, to the working directory (as before)."""
    base = recipe_file.resolve().parent
    if given is None:
        return str(base)
    chosen = Path(given).expanduser()
    if not chosen.is_absolute():
        beside = base / chosen
        chosen = beside if beside.is_dir() or not chosen.is_dir() else chosen
    return str(chosen.resolve())


def recipe_fingerprint(recipe: Recipe) -> str:
    """A stable short hash of the validated recipe (defaults filled in). ``train.device``,
    ``train.dense_backend`` and ``distributed.comm.transport`` (where and how it runs, not what
    it trains) are left out:
    a run resumes on the other device or transport, and checkpoints written before the fields
    existed keep their fingerprint. So is a Keras model's ``model.path``: where the module
    lies is not what it is (its content hash is recorded in every checkpoint), and a run
    directory's copy of the module lies elsewhere than the file the run started from."""
    return _fingerprint(recipe, with_module_path=False)


def fingerprint_matches(recorded: str, recipe: Recipe) -> bool:
    """Whether a checkpoint's recorded fingerprint is ``recipe``'s: :func:`recipe_fingerprint`,
    or, for a Keras model's checkpoints written before ``model.path`` was left out, the
    fingerprint with the path as the run's ``recipe.yaml`` names it."""
    return recorded in accepted_fingerprints(recipe)


def accepted_fingerprints(recipe: Recipe) -> frozenset[str]:
    """The recorded fingerprints that are ``recipe``'s (see :func:`fingerprint_matches`)."""
    now = {recipe_fingerprint(recipe)}
    if recipe.model.type == "keras":
        now.add(_fingerprint(recipe, with_module_path=True))
    return frozenset(now)


def _fingerprint(recipe: Recipe, with_module_path: bool) -> str:
    dumped = recipe.model_dump(mode="json")
    if not with_module_path:
        dumped["model"].pop("path", None)
    dumped["train"].pop("device", None)
    dumped["train"].pop("dense_backend", None)
    dumped["distributed"]["comm"].pop("transport", None)
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def recipe_to_yaml(recipe: Recipe) -> str:
    """The resolved recipe (every default written out) as YAML."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
