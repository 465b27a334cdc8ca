"""M-RoPE positions (Qwen2-VL): three position streams per token, for a request whose prompt shows images.

Text tokens count up by one, their three positions equal. An image's placeholders (one per merged block of 2 x 2
patches, row-major over the image's grid of rows x columns blocks) start where the next text position would: its
temporal position stays there, its height and width positions add the block's row and column. Text after the image
resumes at that start plus the larger of rows and columns. So a prompt with images ends short of (or past) its length
in positions; every later token (the output) takes its index plus that difference (``delta``), three equal
positions again. The same as transformers' ``get_rope_index`` for images (one frame each).
"""

from __future__ import annotations

import numpy as np

from engine.core.multimodal import MultiModalFeature


def use_mrope(model, image_encoder) -> int | None:
    """Give ``model``'s RoPE the encoder's M-RoPE sections; return the encoder's spatial merge (None: plain RoPE)."""
    from engine.models.rotary_embedding import RotaryEmbedding

    section = getattr(image_encoder, "mrope_section", None)
    if section is None:
        return None
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            if 2 * sum(section) != module.head_dim:
                raise ValueError(f"config.json: mrope_section {section} must cover half of each head "
                                 f"({module.head_dim // 2} features)")
            module.mrope_section = list(section)
            module.mrope_interleaved = bool(getattr(image_encoder, "mrope_interleaved", False))
    return image_encoder.spatial_merge_size


def prompt_mrope_positions(num_prompt_tokens: int, features: tuple[MultiModalFeature, ...],
                           spatial_merge_size: int) -> tuple[np.ndarray, int]:
    """([3, num_prompt_tokens] positions, delta: each output token's position minus its index)."""
    positions = np.empty((3, num_prompt_tokens), dtype=np.int64)
    next_position = 0
    cursor = 0
    for feature in features:
        text = feature.offset - cursor
        positions[:, cursor:feature.offset] = np.arange(next_position, next_position + text)
        next_position += text
        frames, rows, columns = feature.data[1]
        rows, columns = rows // spatial_merge_size, columns // spatial_merge_size
        temporal, height, width = np.meshgrid(np.arange(frames), np.arange(rows), np.arange(columns), indexing="ij")
        positions[:, feature.offset:feature.end] = np.stack([temporal.ravel(), height.ravel(), width.ravel()]) \
            + next_position
        next_position += max(rows, columns)
        cursor = feature.end
    positions[:, cursor:] = np.arange(next_position, next_position + num_prompt_tokens - cursor)
    next_position += num_prompt_tokens - cursor
    return positions, next_position - num_prompt_tokens


def batch_mrope_positions(states, num_computed: np.ndarray, num_scheduled: np.ndarray) -> np.ndarray | None:
    """[3, the step's tokens] for a step whose rows include a request with M-RoPE positions (its images); None when
    none does (the step's plain positions are right, and a decode step may replay a CUDA graph)."""
    if not any(state.mrope_positions is not None for state in states):
        return None
    return step_mrope_positions([state.mrope_positions for state in states], [state.mrope_delta for state in states],
                                num_computed, num_scheduled)


def as_plain_positions(positions: np.ndarray) -> np.ndarray | None:
    """A step's [3, tokens] positions as plain [tokens] ones when every token's three are equal (decodes, and text
    after the images, at index + delta): M-RoPE then turns each head as plain RoPE at that position, so the step
    needs no M-RoPE and a decode step may replay a CUDA graph. None when some token's three differ (an image's)."""
    if (positions[0] == positions[1]).all() and (positions[0] == positions[2]).all():
        return positions[0].copy()
    return None


def padded_columns(positions: np.ndarray, length: int) -> np.ndarray:
    """``positions`` [3, n] with zero columns up to ``length`` (the eager step's padded token count)."""
    padded = np.zeros((3, length), dtype=np.int64)
    padded[:, :positions.shape[1]] = positions
    return padded


def step_mrope_positions(prompt_positions: list[np.ndarray | None], deltas: list[int], num_computed: np.ndarray,
                         num_scheduled: np.ndarray) -> np.ndarray:
    """[3, the step's tokens]: each row's scheduled tokens (from its ``num_computed``), from its prompt's positions
    where they are prompt tokens, else index + delta (a row without images: None, delta 0)."""
    pieces = []
    for positions, delta, first, count in zip(prompt_positions, deltas, num_computed.tolist(), num_scheduled.tolist()):
        indices = np.arange(first, first + count)
        if positions is None:
            pieces.append(np.broadcast_to(indices, (3, count)))
            continue
        in_prompt = indices < positions.shape[1]
        row = np.broadcast_to(indices + delta, (3, count)).copy()
        row[:, in_prompt] = positions[:, indices[in_prompt]]
        pieces.append(row)
    return np.concatenate(pieces, axis=1) if pieces else np.zeros((3, 0), dtype=np.int64)
