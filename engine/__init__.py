"""A vLLM-style inference engine: the shared core, the real runner and the front ends."""
