"""A cost model fitted to real step traces: step time as a linear function of the step's features.

The profile is a small JSON file (format documented in ``sim/cost_models/README.md``) written by a
calibration tool with ``save_profile`` and read here with ``load_profile``. Every key is checked on load,
and a bad one is named in the error, so a hand-edited or truncated profile never silently predicts
nonsense. ``"kind": "piecewise_linear"`` adds hinge terms ``coefficient * max(0, feature - knot)``: one
hinge on ``num_tokens`` at the ridge point captures the flat, weight-bound region of small batches and
the compute-bound slope above it, which a single line cannot.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from sim.cost_models.step_batch import FEATURE_NAMES, StepBatch, StepFeatures, step_features

PROFILE_FORMAT = "servesim-step-profile/1"
PROFILE_KINDS = ("linear", "piecewise_linear")
# No engine step, even of the tiny model on a CPU, is faster than this; a fit extrapolated far from its
# data (a negative slope times a huge feature) must still give a positive duration.
DEFAULT_MINIMUM_STEP_TIME_S = 1e-5
_TOP_LEVEL_KEYS = ("format", "kind", "features", "coefficients", "intercept_s", "hinges", "token_count_offsets_s",
                   "minimum_step_time_s", "lora_loads", "ngram_lookup_s", "provenance")
# The adapters' compute terms a profile fitted on LoRA runs has (sim/calibration_fit.py's LORA_FEATURE_SETS).
LORA_FEATURES = ("num_lora_tokens", "num_active_loras")
# The verification terms a profile fitted on speculating runs may have (sim/calibration_fit.py's SPEC_FEATURE_SETS):
# per draft row (its logits and sampling beyond what num_tokens prices), per query-key pair a draft row scores, per
# verification and per KV token a verification reads.
SPEC_FEATURES = ("num_spec_tokens", "spec_attention_work", "num_spec_reqs", "spec_context_tokens")
# "ngram_lookup_s" (optional, profiles fitted on n-gram runs only): the CPU seconds one n-gram lookup takes, per
# request that sampled in a speculating engine's step (sim/speculation.py adds it after the step's pass).
# The vision encoder's terms a profile fitted on runs with images has (sim/calibration_fit.py's ENCODER_FEATURE_SETS).
ENCODER_FEATURES = ("num_encoder_tokens", "encoder_attention_work")
# "lora_loads" (optional, LoRA profiles only): what one adapter load costs, fitted on the recorded slot fills
# (sim/lora_load_fit.py): seconds per adapter byte ("per_byte") or per load ("per_load"), for the copy into a
# slot and for the read from disk that precedes it when the host cache misses.
LORA_LOAD_KINDS = ("per_byte", "per_load")
# Small-batch offsets apply to steps of at most this many tokens (a table, not a curve: on a CPU the
# matmul kernels for 1, 2, 3 rows differ in kind, and step time is not even monotone there).
MAX_OFFSET_TOKEN_COUNT = 64
_REQUIRED_PROVENANCE = ("hardware", "model", "dtype", "created")


@dataclass(frozen=True, slots=True)
class Hinge:
    feature: str
    knot: float
    coefficient: float  # seconds per unit of the feature above the knot


@dataclass(frozen=True, slots=True)
class StepProfile:
    kind: str
    coefficients: dict[str, float]  # seconds per unit of each feature, in the order of "features"
    intercept_s: float
    provenance: dict
    hinges: tuple[Hinge, ...] = ()
    minimum_step_time_s: float = DEFAULT_MINIMUM_STEP_TIME_S
    # Seconds added to steps of exactly this many scheduled tokens (small batches only; may be negative).
    token_count_offsets_s: dict[int, float] = field(default_factory=dict)
    # LoRA profiles: {"kind": per_byte | per_load, "copy_s": ..., "disk_read_s": ...}; None without.
    lora_loads: dict | None = None
    # Profiles fitted on n-gram speculating runs: seconds per lookup (a request that sampled); None without.
    ngram_lookup_s: float | None = None

    @property
    def features(self) -> list[str]:
        return list(self.coefficients)

    @property
    def prices_vision(self) -> bool:
        """Whether it was fitted on runs with images, so prices a step's vision encoder work."""
        return any(name in self.coefficients for name in ENCODER_FEATURES)

    @property
    def prices_speculation(self) -> bool:
        """Whether it was fitted on n-gram speculating runs, so prices verification rows and the lookups."""
        return "num_spec_tokens" in self.coefficients and self.ngram_lookup_s is not None

    @property
    def prices_lora(self) -> bool:
        """Whether the profile was fitted on steps with adapters (it then has their compute terms)."""
        return any(name in self.coefficients for name in LORA_FEATURES)

    def to_dict(self) -> dict:
        data = {"format": PROFILE_FORMAT, "kind": self.kind, "features": self.features,
                "coefficients": dict(self.coefficients), "intercept_s": self.intercept_s}
        if self.kind == "piecewise_linear":
            data["hinges"] = [{"feature": h.feature, "knot": h.knot, "coefficient": h.coefficient}
                              for h in self.hinges]
        if self.token_count_offsets_s:
            data["token_count_offsets_s"] = {str(count): value for count, value in self.token_count_offsets_s.items()}
        data["minimum_step_time_s"] = self.minimum_step_time_s
        if self.lora_loads is not None:
            data["lora_loads"] = dict(self.lora_loads)
        if self.ngram_lookup_s is not None:
            data["ngram_lookup_s"] = self.ngram_lookup_s
        data["provenance"] = self.provenance
        return data

    @classmethod
    def from_dict(cls, data: object, source: str = "<dict>") -> StepProfile:
        """Validate a parsed profile; a ValueError names ``source`` and the offending key."""
        def fail(key: str, problem: str) -> ValueError:
            return ValueError(f"cost profile {source}: key {key!r} {problem}")

        def number(key: str, value: object, minimum: float | None = None) -> float:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise fail(key, f"must be a finite number, got {value!r}")
            if minimum is not None and value < minimum:
                raise fail(key, f"must be >= {minimum}, got {value!r}")
            return float(value)

        def feature_name(key: str, value: object) -> str:
            if value not in FEATURE_NAMES:
                raise fail(key, f"names an unknown feature {value!r}; features: {', '.join(FEATURE_NAMES)}")
            return value

        if not isinstance(data, dict):
            raise ValueError(f"cost profile {source}: expected a JSON object, got {type(data).__name__}")
        for key in data:
            if key not in _TOP_LEVEL_KEYS:
                raise fail(key, f"is not part of the format (keys: {', '.join(_TOP_LEVEL_KEYS)})")
        for key in ("format", "kind", "features", "coefficients", "intercept_s", "provenance"):
            if key not in data:
                raise fail(key, "is missing")
        if data["format"] != PROFILE_FORMAT:
            raise fail("format", f"must be {PROFILE_FORMAT!r}, got {data['format']!r}")
        kind = data["kind"]
        if kind not in PROFILE_KINDS:
            raise fail("kind", f"must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")

        features = data["features"]
        if not isinstance(features, list) or len(set(map(str, features))) != len(features):
            raise fail("features", f"must be a list of distinct feature names, got {features!r}")
        features = [feature_name(f"features[{i}]", name) for i, name in enumerate(features)]
        raw_coefficients = data["coefficients"]
        if not isinstance(raw_coefficients, dict):
            raise fail("coefficients", f"must be an object mapping feature to seconds, got {raw_coefficients!r}")
        for name in raw_coefficients:
            if name not in features:
                raise fail(f"coefficients.{name}", "has no entry in 'features'")
        coefficients = {}
        for name in features:
            if name not in raw_coefficients:
                raise fail(f"coefficients.{name}", "is missing (every listed feature needs a coefficient)")
            coefficients[name] = number(f"coefficients.{name}", raw_coefficients[name])

        hinges: list[Hinge] = []
        if kind == "piecewise_linear":
            raw_hinges = data.get("hinges")
            if not isinstance(raw_hinges, list) or not raw_hinges:
                raise fail("hinges", f"must be a non-empty list for kind 'piecewise_linear', got {raw_hinges!r}")
            for i, hinge in enumerate(raw_hinges):
                where = f"hinges[{i}]"
                if not isinstance(hinge, dict) or set(hinge) != {"feature", "knot", "coefficient"}:
                    raise fail(where, f"must be an object with keys feature, knot, coefficient, got {hinge!r}")
                hinges.append(Hinge(feature=feature_name(f"{where}.feature", hinge["feature"]),
                                    knot=number(f"{where}.knot", hinge["knot"], minimum=0),
                                    coefficient=number(f"{where}.coefficient", hinge["coefficient"])))
        elif "hinges" in data:
            raise fail("hinges", "is only read with kind 'piecewise_linear'")

        raw_offsets = data.get("token_count_offsets_s", {})
        if not isinstance(raw_offsets, dict):
            raise fail("token_count_offsets_s", f"must be an object mapping a token count to seconds, got {raw_offsets!r}")
        offsets: dict[int, float] = {}
        for count, value in raw_offsets.items():
            key = f"token_count_offsets_s.{count}"
            if not str(count).isdigit() or not 1 <= int(count) <= MAX_OFFSET_TOKEN_COUNT:
                raise fail(key, f"must name a token count from 1 to {MAX_OFFSET_TOKEN_COUNT}")
            offsets[int(count)] = number(key, value)

        minimum = number("minimum_step_time_s", data.get("minimum_step_time_s", DEFAULT_MINIMUM_STEP_TIME_S))
        if minimum <= 0:
            raise fail("minimum_step_time_s", f"must be positive, got {minimum!r}")
        lora_loads = None
        if "lora_loads" in data:
            raw = data["lora_loads"]
            if not isinstance(raw, dict) or set(raw) != {"kind", "copy_s", "disk_read_s"}:
                raise fail("lora_loads", f"must be an object with keys kind, copy_s, disk_read_s, got {raw!r}")
            if raw["kind"] not in LORA_LOAD_KINDS:
                raise fail("lora_loads.kind", f"must be one of {', '.join(LORA_LOAD_KINDS)}, got {raw['kind']!r}")
            lora_loads = {"kind": raw["kind"], "copy_s": number("lora_loads.copy_s", raw["copy_s"], minimum=0),
                          "disk_read_s": number("lora_loads.disk_read_s", raw["disk_read_s"], minimum=0)}
        ngram_lookup_s = None
        if "ngram_lookup_s" in data:
            ngram_lookup_s = number("ngram_lookup_s", data["ngram_lookup_s"], minimum=0)
            if "num_spec_tokens" not in coefficients:
                raise fail("ngram_lookup_s", "comes only with the verification terms (features num_spec_tokens, ...) "
                           "of a profile fitted on speculating runs")
        return cls(kind=kind, coefficients=coefficients, intercept_s=number("intercept_s", data["intercept_s"]),
                   provenance=_validate_provenance(data["provenance"], fail), hinges=tuple(hinges),
                   minimum_step_time_s=minimum, token_count_offsets_s=offsets, lora_loads=lora_loads,
                   ngram_lookup_s=ngram_lookup_s)


def _validate_provenance(provenance: object, fail) -> dict:
    if not isinstance(provenance, dict):
        raise fail("provenance", f"must be an object, got {provenance!r}")
    for key in _REQUIRED_PROVENANCE:
        if not isinstance(provenance.get(key), str) or not provenance[key]:
            raise fail(f"provenance.{key}", f"must be a non-empty string, got {provenance.get(key)!r}")
    try:
        datetime.fromisoformat(provenance["created"])
    except ValueError:
        raise fail("provenance.created", f"must be an ISO 8601 time, got {provenance['created']!r}") from None
    fit_error = provenance.get("fit_error")
    if fit_error is not None:
        if not isinstance(fit_error, dict):
            raise fail("provenance.fit_error", f"must be an object, got {fit_error!r}")
        for key, value in fit_error.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise fail(f"provenance.fit_error.{key}", f"must be a number >= 0, got {value!r}")
    if "source_runs" in provenance and not isinstance(provenance["source_runs"], list):
        raise fail("provenance.source_runs", f"must be a list, got {provenance['source_runs']!r}")
    return provenance


def make_provenance(*, hardware: str, model: str, dtype: str, attention_backend: str | None = None,
                    device: str | None = None, source_runs: list[str] | None = None,
                    fit_error: dict[str, float] | None = None) -> dict:
    """The provenance block, with the creation time and software versions filled in."""
    software = {"python": platform.python_version()}
    for package in ("torch", "servesim"):
        try:
            software[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {"hardware": hardware, "model": model, "dtype": dtype, "attention_backend": attention_backend,
            "device": device, "software": software,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source_runs": list(source_runs or []), "fit_error": dict(fit_error or {})}


def save_profile(path: str | Path, coefficients: dict[str, float], intercept_s: float, provenance: dict, *,
                 kind: str = "linear", hinges: list[dict] | None = None,
                 minimum_step_time_s: float = DEFAULT_MINIMUM_STEP_TIME_S,
                 token_count_offsets_s: dict[int, float] | None = None, lora_loads: dict | None = None,
                 ngram_lookup_s: float | None = None) -> StepProfile:
    """Validate and write a profile; return what a later ``load_profile`` will read back."""
    data = {"format": PROFILE_FORMAT, "kind": kind, "features": list(coefficients),
            "coefficients": dict(coefficients), "intercept_s": intercept_s,
            "minimum_step_time_s": minimum_step_time_s, "provenance": provenance}
    if hinges is not None:
        data["hinges"] = hinges
    if token_count_offsets_s:
        data["token_count_offsets_s"] = {str(count): value for count, value in token_count_offsets_s.items()}
    if lora_loads is not None:
        data["lora_loads"] = lora_loads
    if ngram_lookup_s is not None:
        data["ngram_lookup_s"] = ngram_lookup_s
    profile = StepProfile.from_dict(data, source=str(path))  # never write a file the loader would reject
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
    return profile


def load_profile(path: str | Path) -> StepProfile:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"cost profile {path}: cannot be read: {error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"cost profile {path}: is not valid JSON: {error}") from None
    return StepProfile.from_dict(data, source=str(path))


@dataclass
class CalibratedCostModel:
    """``speed_factor`` scales every step time: the machine's speed at the moment relative to the one the
    profile was fitted at (measured by ``sim/speed_probe.py``; 1.03 = 3% slower)."""
    profile: StepProfile
    path: str | None = None
    name: str = "calibrated"
    speed_factor: float = 1.0
    _terms: tuple[tuple[str, float], ...] = field(init=False, repr=False)
    _hinges: tuple[tuple[str, float, float], ...] = field(init=False, repr=False)
    _offsets: dict[int, float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.speed_factor) and self.speed_factor > 0):
            raise ValueError(f"speed_factor must be a positive number, got {self.speed_factor!r}")
        self._terms = tuple(self.profile.coefficients.items())
        self._hinges = tuple((h.feature, h.knot, h.coefficient) for h in self.profile.hinges)
        self._offsets = dict(self.profile.token_count_offsets_s)

    @classmethod
    def from_file(cls, path: str | Path, speed_factor: float = 1.0) -> CalibratedCostModel:
        return cls(load_profile(path), path=str(path), speed_factor=speed_factor)

    def step_time(self, batch: StepBatch) -> float:
        return self.step_time_from_features(step_features(batch))

    def step_time_from_features(self, features: StepFeatures) -> float:
        """The same as ``step_time`` for callers that already derived the features (the simulator)."""
        seconds = self.profile.intercept_s
        for name, coefficient in self._terms:
            seconds += coefficient * getattr(features, name)
        for name, knot, coefficient in self._hinges:
            excess = getattr(features, name) - knot
            if excess > 0:
                seconds += coefficient * excess
        if self._offsets:
            seconds += self._offsets.get(features.num_tokens, 0.0)
        return max(seconds, self.profile.minimum_step_time_s) * self.speed_factor

    @property
    def ngram_lookup_s(self) -> float | None:
        """Seconds one n-gram lookup takes at this model's speed (None: the profile was not fitted on n-gram runs)."""
        lookup_s = self.profile.ngram_lookup_s
        return None if lookup_s is None else lookup_s * self.speed_factor

    def describe(self) -> dict:
        described = {"kind": "calibrated", "path": self.path, "profile": self.profile.to_dict()}
        if self.speed_factor != 1.0:
            described["speed_factor"] = self.speed_factor
        return described
