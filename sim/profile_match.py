"""Which calibrated step profile fits a recorded real run, and how a given one does not.

A profile records what it was fitted on (``provenance``: hardware, device, model, dtype, attention
backend), and a real run what it ran on (``summary.json`` ``config.executor``: the same keys). Without
``--profile``, ``sim.validate`` takes the shipped profile that fits the run best; with one, it names
every difference, in the words ``sim.run --cost-model`` uses for a workload's preset.

A profile fitted on another kind of device (a CPU profile for a GPU run) is refused unless the user
insists: its step times are off by orders of magnitude (a CPU profile timed a recorded H200 run
+2,100%), so the comparison would measure the profile's device, not the simulator, and a fidelity
report is exactly the place where such a number gets quoted. That is the rule Vidur follows (profiles
are keyed by device and model), and vLLM's habit for a configuration that cannot mean what it says:
refuse up front. Other differences stay warnings: another CPU, another thread count, another backend
or dtype is a near neighbour whose comparison is still worth seeing, as long as the reader is told.
"""

from __future__ import annotations

from pathlib import Path

from sim.cost_models.calibrated import load_profile

SHIPPED_PROFILES_DIR = Path(__file__).parent / "data" / "profiles"
# What a profile and a run both record, in the order a difference matters most to the step times.
IDENTITY_KEYS = ("model", "dtype", "hardware", "attention_backend")


class ProfileMismatchError(ValueError):
    """A profile fitted on another kind of device than the run's (a CPU profile for a GPU run)."""


def device_kind(device: object) -> str:
    """``"cuda"`` of ``"cuda:0"``; ``""`` when not recorded."""
    return str(device or "").split(":")[0].strip().lower()


def mismatches(provenance: dict, executor: dict) -> list[tuple[str, str, str]]:
    """(key, fitted, used) for every identity the profile and the run both record and that differ."""
    differences = []
    for key in IDENTITY_KEYS:
        fitted, used = provenance.get(key), executor.get(key)
        if fitted is None or used is None or str(fitted).lower() == str(used).lower():
            continue
        differences.append((key, str(fitted), str(used)))
    return differences


def describe_mismatch(key: str, fitted: str, used: str) -> str:
    return f"the profile was fitted for {key} {fitted!r}, but this run used {used!r}"


def check_profile_fits(provenance: dict, executor: dict, profile: Path | str, *, allow_mismatch: bool
                       ) -> list[str]:
    """The warnings for ``profile`` against a run that ran on ``executor``; raise ProfileMismatchError
    for another kind of device unless ``allow_mismatch`` (then it is one more warning)."""
    fitted_kind, used_kind = device_kind(provenance.get("device")), device_kind(executor.get("device"))
    notes = [describe_mismatch(*difference) for difference in mismatches(provenance, executor)]
    if fitted_kind and used_kind and fitted_kind != used_kind:
        message = (f"--profile: {str(profile)!r} was fitted on device {_device(fitted_kind, provenance)}, but the "
                   f"run is on {_device(used_kind, executor)}; its step times would be meaningless here")
        if not allow_mismatch:
            raise ProfileMismatchError(message + f": give a profile fitted on {used_kind} (sim.calibrate), or "
                                                 "--allow-profile-mismatch to compare anyway")
        notes.insert(0, message)
    return notes


def _device(kind: str, identity: dict) -> str:
    hardware = identity.get("hardware")
    return f"{kind!r} ({hardware})" if hardware else repr(kind)


def shipped_profiles() -> list[tuple[Path, dict]]:
    return [(path, load_profile(path).provenance) for path in sorted(SHIPPED_PROFILES_DIR.glob("*.json"))]


def default_profile_for(executor: dict) -> Path:
    """The shipped profile fitted on the run's kind of device that differs from it in the fewest (and
    least important) ways; ProfileMismatchError when none was fitted on that kind of device."""
    used_kind = device_kind(executor.get("device"))
    # A profile fitted on LoRA or speculating runs is never the default: its base terms come from short recordings
    # of that kind, and such a run is compared only with a profile given by name (sim/validate.py says which).
    candidates = [(path, provenance) for path, provenance in shipped_profiles()
                  if device_kind(provenance.get("device")) == used_kind and "lora" not in provenance
                  and "speculative_decoding" not in provenance]
    if not candidates:
        shipped = ", ".join(f"{path.name} ({device_kind(provenance.get('device'))})"
                            for path, provenance in shipped_profiles())
        raise ProfileMismatchError(f"no shipped profile was fitted on device {used_kind or 'unknown'!r}, where the "
                                   f"run ran (shipped: {shipped}); fit one with sim.calibrate and give it with --profile")

    def distance(candidate: tuple[Path, dict]) -> tuple:
        differing = {key for key, _, _ in mismatches(candidate[1], executor)}
        return tuple(key in differing for key in IDENTITY_KEYS)

    return min(candidates, key=distance)[0]


__all__ = ["ProfileMismatchError", "SHIPPED_PROFILES_DIR", "check_profile_fits", "default_profile_for",
           "describe_mismatch", "device_kind", "mismatches"]
