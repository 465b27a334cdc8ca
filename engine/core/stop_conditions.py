"""When a request stops generating (the seed's ``check_stop``), checked after every appended token.

Order: a stop token (EOS unless ``ignore_eos``, or one of ``stop_token_ids``) ends the request as
FINISHED_STOPPED once ``min_tokens`` outputs exist; otherwise reaching the output cap ends it as
FINISHED_LENGTH_CAPPED. The scheduler sets ``request.max_tokens`` at admission to the smaller of the
user's ``max_tokens`` and the room left under the model's length limit, so one comparison covers both.
Stop *strings* need text and are applied by the output processor, not here.
"""

from __future__ import annotations

from engine.core.request import Request, RequestStatus


def finish_if_stopped(request: Request) -> bool:
    """Set the request's final status and return True if its last token ends it."""
    num_output_tokens = len(request.output_token_ids)
    params = request.sampling_params
    if num_output_tokens >= params.min_tokens:
        last_token_id = request.output_token_ids[-1]
        if last_token_id == request.eos_token_id and not params.ignore_eos:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last_token_id in params.all_stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last_token_id
            return True
    if request.max_tokens is not None and num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False
