"""Rank functions a test names as ``scheduling policy "module:function"``: a user's own policy."""


def longest_prompt_first(request) -> int:
    return -request.num_prompt_tokens


def by_request_id_suffix(request) -> tuple[int, str]:
    """Ranks "x-3" before "x-7": a tuple rank, as a policy of several keys would return."""
    return (int(request.request_id.rsplit("-", 1)[1]), request.request_id)


NOT_CALLABLE = 3
