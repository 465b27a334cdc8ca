"""Speculative decoding in the real runner: the n-gram proposer, the verification of drafts, and the config."""

from engine.runner.spec_decode.config import SpeculativeConfig
from engine.runner.spec_decode.ngram_proposer import NgramProposer
from engine.runner.spec_decode.verification import can_speculate, verify_drafts

__all__ = ["NgramProposer", "SpeculativeConfig", "can_speculate", "verify_drafts"]
