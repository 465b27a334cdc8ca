"""The shared core: requests, the paged KV-block pool with prefix caching, and the V1-style scheduler.

Pure Python (standard library only), deterministic, and shared unchanged by the real model runner
and the simulator. See DESIGN.md for the invariants the tests check.
"""

from engine.core.block_hash import hash_request_blocks, make_block_hasher
from engine.core.block_pool import BlockPool
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.engine_core import EngineCore, EngineStepResult, Executor
from engine.core.free_block_queue import FreeKVCacheBlockQueue, KVCacheBlock
from engine.core.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.lora import LoRARequest
from engine.core.multimodal import MultiModalFeature
from engine.core.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerStats
from engine.core.pooling_params import PoolerConfig, PoolingParams
from engine.core.prefix_cache_stats import PrefixCacheStats
from engine.core.request import Request, RequestStatus
from engine.core.sampling_params import SamplingParams, SamplingType
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.core.scripted_executor import ScriptedExecutor
from engine.core.structured_outputs import StructuredOutputsParams

__all__ = [
    "AllBlocksCleared", "BlockPool", "BlockRemoved", "BlockStored", "CacheConfig", "CachedRequestData",
    "EngineCore", "EngineCoreOutput", "EngineStepResult", "Executor", "FreeKVCacheBlockQueue", "KVCacheBlock",
    "KVCacheManager", "LoRARequest", "ModelRunnerOutput", "MultiModalFeature", "NewRequestData", "PoolerConfig", "PoolingParams", "PrefixCacheStats", "Request", "RequestStatus",
    "SamplingParams", "SamplingType", "Scheduler", "SchedulerConfig", "SchedulerOutput", "SchedulerStats",
    "ScriptedExecutor", "StructuredOutputsParams", "hash_request_blocks", "make_block_hasher",
]
