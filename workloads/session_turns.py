"""Drawing each session's later turns (workload.sessions): their user tokens, output lengths, think times.

Each quantity draws from its own stream, in session order, one value per turn: the number of turns one
per session, then the later turns' user lengths, output lengths and think times as flat runs over all
sessions' later turns. So a rate sweep leaves every session's turns unchanged (arrivals draw elsewhere),
and a session's draws do not depend on its arrival time.

A session ends before the first turn whose prompt plus output would pass the total length cap: its
prompt is the whole conversation so far, known in advance because every turn generates exactly its
output length (ignore_eos).
"""

from __future__ import annotations

from array import array

import numpy as np

from workloads.distributions import LengthDistribution
from workloads.random_streams import Stream, random_stream
from workloads.session_section import SessionSection
from workloads.tokens import TokenVocabulary

# (user tokens, output length, think time in seconds): one later turn, before it has a request id.
DrawnTurn = tuple[array, int, float]


def draw_later_turns(sessions: SessionSection, output_len: LengthDistribution, seed: int, prompt_lens: np.ndarray,
                     output_lens: np.ndarray, cap: int | None, vocabulary: TokenVocabulary) -> list[list[DrawnTurn]]:
    """Per session (one per first turn, in order), its later turns within ``cap`` tokens."""
    count = len(prompt_lens)
    later_counts = sessions.turns.sample(random_stream(seed, Stream.SESSION_TURNS), count) - 1
    total = int(later_counts.sum())
    user_lens = sessions.user_len.sample(random_stream(seed, Stream.SESSION_USER_LENGTHS), total)
    turn_outputs = output_len.sample(random_stream(seed, Stream.SESSION_OUTPUT_LENGTHS), total)
    think_times = sessions.think_time_s.sample(random_stream(seed, Stream.THINK_TIMES), total)
    kept = _turns_within_cap(later_counts, prompt_lens, output_lens, user_lens, turn_outputs, cap)
    token_bytes = np.ascontiguousarray(
        vocabulary.random_tokens(random_stream(seed, Stream.SESSION_TOKENS), int(user_lens.sum())), dtype=np.int64
    ).tobytes()
    sessions_turns: list[list[DrawnTurn]] = []
    turn = token = 0
    for later, keep in zip(later_counts.tolist(), kept, strict=True):
        turns: list[DrawnTurn] = []
        for index in range(turn, turn + later):
            length = int(user_lens[index])
            if index - turn < keep:
                tokens = array("q")
                tokens.frombytes(token_bytes[token * 8 : (token + length) * 8])
                turns.append((tokens, int(turn_outputs[index]), float(think_times[index])))
            token += length
        turn += later
        sessions_turns.append(turns)
    return sessions_turns


def _turns_within_cap(later_counts: np.ndarray, prompt_lens: np.ndarray, output_lens: np.ndarray,
                      user_lens: np.ndarray, turn_outputs: np.ndarray, cap: int | None) -> list[int]:
    """How many later turns each session keeps: those before the first that would pass ``cap``."""
    kept: list[int] = []
    turn = 0
    for later, prompt, output in zip(later_counts.tolist(), prompt_lens.tolist(), output_lens.tolist(), strict=True):
        conversation = prompt + output
        keep = later
        for offset in range(later):
            prompt = conversation + int(user_lens[turn + offset])
            output = int(turn_outputs[turn + offset])
            if cap is not None and prompt + output > cap:
                keep = offset
                break
            conversation = prompt + output
        kept.append(keep)
        turn += later
    return kept
