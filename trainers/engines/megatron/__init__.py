"""Megatron-core engine: ``ENGINES.make("megatron", config=EngineConfig(...), options=MegatronConfig(...))``.

Modules: ``engine`` (MegatronEngine), ``model`` (HF config -> GPTModel), ``convert`` (HF <->
Megatron weights), ``attention`` (SDPA core attention), ``logprobs`` (vocab-parallel
logprobs), ``state`` (weights out, checkpoints, offload). Importing this package imports
nothing heavy.
"""
