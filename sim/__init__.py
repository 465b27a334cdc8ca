"""The simulator: a SimPy executor beside the real one, driven by a cost model (see sim/cost_models/)."""
