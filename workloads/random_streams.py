"""Independent random streams, one per quantity, all derived from the workload's seed.

Each quantity (arrival gaps, prompt lengths, output lengths, ...) draws from its own stream, so
changing one part of a workload changes only that part of the request stream: a sweep over arrival
rates replays the very same prompts and outputs at each rate, which is what a what-if study needs.
The stream numbers are fixed forever; a new quantity gets a new number, never a reused one.
"""

from __future__ import annotations

import enum

import numpy as np


class Stream(enum.IntEnum):
    ARRIVALS = 0
    PROMPT_LENGTHS = 1
    OUTPUT_LENGTHS = 2
    PREFIX_GROUPS = 3
    PRIORITIES = 4
    PROMPT_TOKENS = 5
    PREFIX_TOKENS = 6
    TRACE_ROWS = 7
    PHASES = 8
    # Output lengths of completions 1..n-1 of a prompt (workload.n); completion 0 keeps OUTPUT_LENGTHS, so
    # n = 1 draws exactly what it drew before n existed.
    COMPLETION_OUTPUT_LENGTHS = 9
    # The replica a request goes to under cluster.router: random (sim/router.py).
    ROUTING = 10
    # The decode replica a request goes to after its prefill (cluster.prefill_replicas > 0).
    DECODE_ROUTING = 11
    # Which draft tokens a verification accepts (engine.speculative_decoding; sim/speculation.py).
    SPECULATIVE_ACCEPTANCE = 12
    # Seeds of the further request classes (workload.classes), as PHASES is for later stretches.
    CLASSES = 13
    # Which LoRA adapter each request runs with (workload.lora; workloads/lora_section.py).
    LORA_ADAPTERS = 14
    # Multi-turn sessions (workload.sessions; workloads/session_turns.py): turns per session, and each later
    # turn's user length, output length, think time and user tokens.
    SESSION_TURNS = 15
    SESSION_USER_LENGTHS = 16
    SESSION_OUTPUT_LENGTHS = 17
    THINK_TIMES = 18
    SESSION_TOKENS = 19
    # Which requests show images, how many, which images and their sizes (workload.images; workloads/images.py).
    IMAGES = 20
    IMAGE_SIZES = 21
    # Which experts a mixture of experts' router favours (workload.expert_popularity; sim/expert_popularity.py).
    EXPERT_POPULARITY = 22
    # How many drafts an n-gram lookup offers (engine.speculative_decoding.proposal_rate; sim/speculation.py).
    SPECULATIVE_PROPOSALS = 23


def stream_seed(seed: int, stream: Stream) -> np.random.SeedSequence:
    return np.random.SeedSequence(seed, spawn_key=(int(stream),))


def random_stream(seed: int, stream: Stream) -> np.random.Generator:
    return np.random.default_rng(stream_seed(seed, stream))


def phase_seed(seed: int, phase: int) -> int:
    """The seed of a workload's ``phase``-th later stretch (1, 2, ...): its own streams, independent of
    the first stretch's and of each other's, fixed by the workload's seed."""
    state = np.random.SeedSequence(seed, spawn_key=(int(Stream.PHASES), phase)).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))  # below 2**63, as a workload seed is


def class_seed(seed: int, class_index: int) -> int:
    """The seed of a workload's ``class_index``-th request class (1, 2, ...: ``workload.classes[class_index - 1]``;
    class 0, the top-level stream, keeps the workload's seed): its own streams, independent of every other
    class's and of the phases', fixed by the workload's seed and the class's position."""
    state = np.random.SeedSequence(seed, spawn_key=(int(Stream.CLASSES), class_index)).generate_state(1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))  # below 2**63, as a workload seed is
