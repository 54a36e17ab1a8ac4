"""Reading specs and component configs: :func:`load_spec`, :func:`load_component`, :func:`json_schema`.

A spec is read (a file, a JSON string or a dict), validated against the live model (:func:`modkit.spec.unions.
spec_model`), then checked across fields (:mod:`modkit.spec.checks`). Every problem found is collected into one
:class:`~modkit.core.errors.SpecError`: a spec failing the schema also gets the cross-field errors of its parts
that passed it (:func:`_valid_parts_errors`), so one run reports both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from pydantic import TypeAdapter, ValidationError

from modkit.core.config import ComponentConfig
from modkit.core.errors import SpecError
from modkit.core.jsonio import JSONInputError, check_document, parse_json, read_json_file
from modkit.core.limits import MAX_LAYERS, MAX_OVERRIDES
from modkit.core.registry import Registry, get_registry
from modkit.core.validation import json_kind
from modkit.spec.checks import _semantic_errors
from modkit.spec.errors import _format_errors
from modkit.spec.models import MIXER_KEYS, BlockSpec, DropoutSpec, LayerOverride, ModelSpec
from modkit.spec.unions import slot_type, spec_model


def load_component(
    kind: str, data: Union[dict, ComponentConfig], *, registry: Registry | None = None
) -> ComponentConfig:
    """Validate one component config of ``kind`` (e.g. ``{"type": "rmsnorm", "eps": 1e-6}``) on its own.

    Nested slots resolve against the live registry, as in a full spec.

    Raises:
        SpecError: with ``(path, message)`` pairs relative to the component.
    """

    reg = registry or get_registry()
    if isinstance(data, ComponentConfig):
        data = data.model_dump(mode="json")
    annotation = slot_type(kind, reg)
    if annotation is None:
        raise SpecError([("", reg.unknown_kind_message(kind))])
    try:
        return TypeAdapter(annotation).validate_python(data)
    except ValidationError as exc:
        raise SpecError(_format_errors(exc.errors(), data, reg)) from None


_SLOTS = ("attention", "ffn", "norm", "placement")
_SIZES = ("vocab_size", "d_model", "n_layers", "max_seq_len")


class _ValidParts:
    """The parts of a spec document that passed the schema on their own, as configs (``None`` for the others).

    ``bad`` holds the JSON paths of the schema errors: a part with an error at or below its path is left out.
    """

    def __init__(self, data: dict, bad: list[str], registry: Registry):
        self.data, self.bad, self.registry = data, bad, registry

    def clean(self, path: str) -> bool:
        """Whether no schema error lies at or below ``path``."""
        return not any(b == path or b.startswith((path + ".", path + "[")) for b in self.bad)

    def component(self, kind: str, path: str, value: Any) -> Optional[ComponentConfig]:
        """``value`` validated alone as a config of ``kind``; ``None`` when it is not clean or fails."""
        if not isinstance(value, dict) or not self.clean(path):
            return None
        try:
            return load_component(kind, value, registry=self.registry)
        except SpecError:
            return None

    def slots(self, holder: dict, where: str, cls: type) -> Any:
        """A block or override (``cls``) built from its valid slots, the mixer under the key the document used."""
        key = next((k for k in MIXER_KEYS if k in holder), "attention")
        got = {
            s: self.component(
                "mixer" if s == "attention" else s,
                f"{where}.{key if s == 'attention' else s}",
                holder.get(key if s == "attention" else s),
            )
            for s in _SLOTS
        }
        if cls is LayerOverride:
            got["position"] = self.component("position", f"{where}.position", holder.get("position"))
            got["layers"] = self.layers(holder, where)
        built = cls.model_construct(**got)
        built._mixer_key = key
        return built

    def layers(self, holder: dict, where: str) -> Any:
        """An override's layer selection, or ``None`` when it is missing or not clean."""
        if "layers" not in holder or not self.clean(f"{where}.layers"):
            return None
        try:
            return TypeAdapter(LayerOverride.model_fields["layers"].annotation).validate_python(holder["layers"])
        except ValidationError:
            return None

    def dropout(self) -> DropoutSpec:
        """The dropout probabilities, or all 0 when unknown (their checks are then skipped)."""
        if self.clean("dropout"):
            try:
                return DropoutSpec.model_validate(self.data.get("dropout", {}))
            except ValidationError:
                pass
        return DropoutSpec()

    def spec(self) -> tuple[ModelSpec, bool]:
        """``(partial spec, complete)``: a :class:`ModelSpec` built without validation from the valid parts, and
        whether every attention config and layer selection is among them (position schemes are then checked with
        the attention geometry)."""
        data = self.data
        parts: dict[str, Any] = {n: data[n] for n in _SIZES}
        parts["position"] = self.component("position", "position", data.get("position"))
        parts["block"] = self.slots(data["block"] if isinstance(data.get("block"), dict) else {}, "block", BlockSpec)
        for name in ("embedding_norm", "final_norm"):
            parts[name] = self.component("norm", name, data.get(name))
        parts["stream"] = self.component("stream", "stream", data.get("stream"))
        complete = parts["position"] is not None and parts["block"].attention is not None
        parts["dropout"] = self.dropout()
        listed = data.get("overrides") if isinstance(data.get("overrides"), list) else []
        parts["overrides"] = []
        for i, o in enumerate(listed):
            parts["overrides"].append(self.slots(o if isinstance(o, dict) else {}, f"overrides[{i}]", LayerOverride))
            complete = complete and self.clean(f"overrides[{i}]")
        return ModelSpec.model_construct(**parts), complete


def _valid_parts_errors(data: dict, schema_errors: list[tuple[str, str]], registry: Registry) -> list[tuple[str, str]]:
    """The cross-field errors of the parts of a spec that failed the schema which passed it on their own.

    A spec with a schema error (``block.ffn.d_ff = -1``) may hold independent cross-field errors elsewhere
    (``d_model`` not divisible by ``block.attention.n_heads``); reporting them in the same run saves a round trip.
    Every component config without a schema error at or below its path is validated alone and checked with the
    model-wide sizes, when those are valid; a component with a schema error is not (its own values are unknown, so
    a check would guess). Position schemes are checked without the attention geometry unless every attention
    config and layer selection is valid.
    """
    bad = [p for p, _ in schema_errors]
    if "" in bad or any(n in bad or n not in data for n in _SIZES):
        return []
    partial, complete = _ValidParts(data, bad, registry).spec()
    try:
        return _semantic_errors(partial, registry, geometry=complete)
    except Exception:  # noqa: BLE001 - a check written for valid specs only; the schema errors stand on their own
        return []


def _read_document(source: Union[str, Path, dict, ModelSpec]) -> tuple[Any, list[tuple[str, str]], Optional[str]]:
    """``(document, read errors, label)`` of a spec source (see :func:`load_spec`): the read errors are those
    reported with the schema's errors of the same document (duplicate keys); ``label`` names a file.

    Raises:
        SpecError: an unreadable file, malformed JSON, or a document nested too deep.
    """
    if isinstance(source, ModelSpec):
        return source.to_dict(), [], None
    if isinstance(source, dict):
        try:  # the nesting bound a file gets (modkit.core.jsonio), for a dict built in Python
            check_document(source)
        except JSONInputError as exc:
            raise SpecError(exc.errors) from None
        return source, [], None
    text = source if isinstance(source, str) else None
    label = None
    try:
        if text is not None and text.lstrip().startswith("{"):
            return parse_json(text), [], None
        label = str(source)
        return read_json_file(source), [], label
    except JSONInputError as exc:
        if exc.document is None:
            raise SpecError(exc.errors, source=label) from None
        return exc.document, exc.errors, label


def _override_count_error(data: dict) -> Optional[tuple[str, str]]:
    """The error of a spec listing more than :data:`~modkit.core.limits.MAX_OVERRIDES` overrides, else ``None``."""
    overrides = data.get("overrides")
    if not isinstance(overrides, list) or len(overrides) <= MAX_OVERRIDES:
        return None
    return (
        "overrides",
        f"{len(overrides):,} overrides exceed modkit's bound of {MAX_OVERRIDES:,} (modkit.core.limits: twice the "
        f"{MAX_LAYERS}-layer bound, far above one override per layer of any published model); give one override "
        "a list of layers or a range {start, stop, step} for layers that take the same replacement",
    )


def load_spec(source: Union[str, Path, dict, ModelSpec], *, registry: Registry | None = None) -> ModelSpec:
    """Parse and validate a spec.

    Args:
        source: a path to a ``.json`` file, a JSON string, a dict, or an already-validated :class:`ModelSpec`
            (re-validated against ``registry``).
        registry: defaults to the process-wide registry with every installed plugin.

    Returns:
        A validated :class:`ModelSpec` (instance of the live subclass).

    Raises:
        SpecError: with every ``(path, message)``: unreadable file (missing, not a regular file, over 16 MiB,
            not UTF-8), malformed JSON (line and column), duplicate keys, nesting over 64 levels (see
            :mod:`modkit.core.jsonio`), schema violations (strict types, non-finite floats, sizes over the bounds of
            :mod:`modkit.core.limits`), unknown component types (the close matches and ``modkit list KIND`` named) and
            cross-field problems such as ``block.attention: n_kv_heads = 5 does not divide n_heads = 32``.
    """
    reg = registry or get_registry()
    data, read_errors, label = _read_document(source)
    if not isinstance(data, dict):
        raise SpecError(read_errors + [("", f"a spec is a JSON object, got {json_kind(data)}")], source=label)
    too_many = _override_count_error(data)
    if too_many:  # refused before validation, which takes time in proportion to the count
        raise SpecError(read_errors + [too_many], source=label)
    model = spec_model(reg)
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        errors = read_errors + _format_errors(exc.errors(), data, reg)
        errors += _valid_parts_errors(data, errors, reg)
        raise SpecError(list(dict.fromkeys(errors)), source=label) from None
    errors = list(dict.fromkeys(read_errors + _semantic_errors(spec, reg)))
    if errors:
        raise SpecError(errors, source=label)
    return spec


def json_schema(registry: Registry | None = None) -> dict:
    """JSON Schema (draft 2020-12) of specs with the installed components, for editors (``"$schema"`` key)."""
    schema = spec_model(registry).model_json_schema(by_alias=True)
    for name in ("BlockSpec", "LayerOverride"):  # the token mixer may be written 'mixer' or 'attention'
        d = schema.get("$defs", {}).get(name)
        if d is None or "attention" not in d.get("properties", {}):
            continue
        d["properties"]["mixer"] = d["properties"]["attention"]
        if "attention" in d.get("required", []):
            d["required"] = [r for r in d["required"] if r != "attention"]
            d["oneOf"] = [{"required": ["mixer"]}, {"required": ["attention"]}]
        else:
            d["not"] = {"required": ["mixer", "attention"]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema.setdefault("title", "modkit model spec")
    return schema
