"""The models llmq serves, by the name clients ask for.

Without a catalog file (`LLMQ_CATALOG` unset) llmq serves one model, `LLMQ_MODEL`, named after its
source (today's single-model setup). A catalog file names several, each with its own source and,
optionally, its own engine settings:

    default = "smollm2"            # what a request naming no model gets (else: the first one)

    [models.smollm2]
    source = "embedded"            # a local folder, a .gguf file, a hub name or "embedded"

    [models.qwen]
    source = "Qwen/Qwen2.5-0.5B-Instruct"
    weights = "int4"               # any of OVERRIDABLE below
    max_batch_size = 8
    prompt_lookup = true           # answers that quote their input: speculative decoding pays

TOML or JSON (by the file's suffix), the same shape. A catalog model is resolved without the
embedded fallback a lone `LLMQ_MODEL` has: a name must never be answered by another model.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.models import ModelRef, resolve_model
from common.settings import Settings

# Settings a catalog entry may set for its own model: how it is loaded and what a request may ask of it
OVERRIDABLE = frozenset({"engine", "weights", "dtype", "kv_cache_mb", "max_batch_size", "max_model_len",
                         "prefix_cache_mb", "max_prefill_tokens", "max_tokens_cap", "default_max_tokens",
                         "prompt_lookup", "prompt_lookup_tokens", "prompt_lookup_ngram",
                         "openvino_activation_group"})


class CatalogError(ValueError):
    """The catalog file cannot be read or says something llmq cannot serve."""


@dataclass(frozen=True)
class CatalogModel:
    name: str | None  # None: the one model of a deployment without a catalog, named after its source
    source: str
    overrides: dict = field(default_factory=dict)

    def settings(self, base: Settings) -> Settings:
        """`base` as this model is served with: its source and its own settings."""
        return Settings.model_validate({**base.model_dump(), **self.overrides, "model": self.source})

    def resolve(self, base: Settings, prepare: bool = False) -> ModelRef:
        """Where its weights are (see `resolve_model`), under the catalog's name."""
        if self.name is None:
            return resolve_model(base, prepare)
        ref = resolve_model(self.settings(base), prepare, fallback=False)
        return replace(ref, name=self.name, source_name=ref.name)


class Catalog:
    def __init__(self, models: list[CatalogModel], default: str | None = None):
        if not models:
            raise CatalogError("the catalog names no model")
        self.models = {m.name: m for m in models}
        self.default = self.models[default] if default is not None else models[0]

    @classmethod
    def from_settings(cls, settings: Settings) -> "Catalog":
        if settings.catalog is None:
            return cls([CatalogModel(None, settings.model)])
        return cls.from_file(settings.catalog)

    @classmethod
    def from_file(cls, path: Path) -> "Catalog":
        try:
            text = Path(path).expanduser().read_text()
            data = json.loads(text) if Path(path).suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as exc:
            raise CatalogError(f"catalog {path}: {exc}") from exc
        entries = data.get("models")
        if not isinstance(entries, dict) or not entries:
            raise CatalogError(f"catalog {path}: no [models.<name>] entries")
        models = [_entry(name, spec) for name, spec in entries.items()]
        default = data.get("default")
        if default is not None and default not in entries:
            raise CatalogError(f"catalog {path}: default {default!r} is not one of its models")
        return cls(models, default)

    @property
    def named(self) -> bool:
        """Whether models are served under catalog names (a catalog file) rather than their source's."""
        return self.default.name is not None

    def get(self, name: str | None) -> CatalogModel | None:
        """The model a request names (None: the default); None when it is not in the catalog. Without
        a catalog file any name may be the served one: the caller compares it with the resolved name."""
        if name is None or not self.named:
            return self.default
        return self.models.get(name)


def _entry(name: str, spec) -> CatalogModel:
    if not isinstance(spec, dict) or not isinstance(spec.get("source"), str):
        raise CatalogError(f"catalog model {name!r}: needs source = \"<folder, .gguf, hub name or embedded>\"")
    unknown = set(spec) - OVERRIDABLE - {"source"}
    if unknown:
        raise CatalogError(f"catalog model {name!r}: unknown settings {sorted(unknown)}; "
                           f"a model may set {sorted(OVERRIDABLE)}")
    overrides = {k: v for k, v in spec.items() if k != "source"}
    model = CatalogModel(name, spec["source"], overrides)
    try:
        model.settings(Settings())
    except ValueError as exc:
        raise CatalogError(f"catalog model {name!r}: {exc}") from exc
    return model
