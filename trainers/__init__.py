"""Training: engines (torch-native, Megatron-core), workers, the RL driver, SFT and checkpoints.

Importing ``trainers`` loads nothing heavy; torch and transformers load when an engine is built.
"""
