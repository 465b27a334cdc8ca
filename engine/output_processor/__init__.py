"""Front-end output processing: incremental detokenization, stop strings, logprobs, RequestOutputs."""

from engine.output_processor.detokenizer import IncrementalDetokenizer
from engine.output_processor.logprobs import LogprobsProcessor, TokenDecoder
from engine.output_processor.output_processor import OutputProcessor, OutputProcessorOutput
from engine.output_processor.request_state import RequestState
from engine.output_processor.stop_strings import StopStringMatch, find_stop_string

__all__ = [
    "IncrementalDetokenizer", "LogprobsProcessor", "OutputProcessor", "OutputProcessorOutput", "RequestState",
    "StopStringMatch", "TokenDecoder", "find_stop_string",
]
